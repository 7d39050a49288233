-- name: peek
-- What the next resolve would target, without taking it (read only). The head is the first stacked
-- id that pending.lua would show too: one whose spec is gone, or that is past its ttl, is skipped,
-- never named.
-- flags: no-writes, allow-oom
-- roles: producer, serve
-- KEYS
--   directive  (string)
--   stack      (zset: the lowest score is the head)
--   actions    (hash)
--   expiries   the partition's expiries (zset "<session>/<id>" -> expiry ms)
-- ARGV
--   session
-- Returns: {"directive", id, spec JSON} | {"head", id} | {}
redis.replicate_commands()
local id = redis.call('GET', directive)
if id then
  local spec = redis.call('HGET', actions, id)
  if spec then return {'directive', id, spec} end
end
local now = now_ms()
local start = 0
while true do
  local ids = redis.call('ZRANGE', stack, start, start + 15)
  if #ids == 0 then return {} end
  for _, one in ipairs(ids) do
    if redis.call('HEXISTS', actions, one) == 1
        and not past_ttl(expiries, session .. '/' .. one, now) then
      return {'head', one}
    end
  end
  start = start + 16
end
