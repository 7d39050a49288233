-- peek: what the next resolve would target, without taking it (read only).
-- KEYS[1] directive (string)  KEYS[2] stack (list)  KEYS[3] actions (hash)
-- Returns: {"directive", spec JSON} | {"head", id} | {}
local id = redis.call('GET', KEYS[1])
if id then
  local spec = redis.call('HGET', KEYS[3], id)
  if spec then return {'directive', spec} end
end
id = redis.call('LINDEX', KEYS[2], 0)
if id then
  return {'head', id}
end
return {}
