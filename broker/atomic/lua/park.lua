-- name: park
-- Move a record of a session that does not parse (a spec, its counters, a lease) out of the way,
-- onto the session's dead-letter list with its raw bytes and the reason, so that the session and
-- every other one carry on. Never loses an action: parking a spec or its counters dead-letters the
-- action itself (with its raw spec, and its raw counters), and ends every lease that holds it, so
-- that it is nowhere else (not pending, not in flight: one outcome); parking a lease puts the
-- action it held back where it was (found as the one spec neither stacked, in a slot, nor held by
-- another lease).
-- flags: allow-oom
-- roles: worker
-- KEYS
--   actions    (hash)
--   state      (hash)
--   inflight   (hash)
--   stack      (zset: the lowest score is the head)
--   directive  (string)
--   standing   (string)
--   dead       (list)
--   hist       history (stream)
--   replies    reply (list; a request's, or any key of the session)
--   leases     the partition's lease index (zset): a lease ended here leaves it too
-- ARGV
--   what         "spec" | "state" | "lease"
--   field        action id (spec, state) or token
--   raw          the raw bytes as read by the caller (parked only if the record still holds them)
--   raw_text     the raw bytes as JSON-safe text
--   reason
--   maxlen       history maxlen
--   reply        JSON for a resolver waiting on it ("" for none)
--   reply_ttl_s  reply ttl s
--   token        lease token to end with a parked spec ("" for none)
--   session      (a lease's index member is "<session>/<token>")
-- Returns: 1 when parked, 0 when the record had changed or gone meanwhile.
local hash = ({spec = actions, state = state, lease = inflight})[what]
if redis.call('HGET', hash, field) ~= raw then
  return 0
end
local now = now_ms()
local id = what == 'lease' and '' or field
local parked = {id = id, reason = 'unreadable ' .. what .. ': ' .. reason, poison = what,
  field = field, raw = raw_text, at = now}
-- parked counters keep their action's spec beside them: its own JSON text when it is JSON (as
-- recover.lua keeps it: cjson would write an empty object as []), else as a string
local spec = what == 'state' and redis.call('HGET', actions, id)
local spec_json = false
if spec then
  local ok, decoded = pcall(cjson.decode, spec)
  spec_json = ok and type(decoded) == 'table'
  if not spec_json then parked.spec = spec end
end
if what ~= 'lease' then
  -- the record parked is the spec or the counters of id: both go
  redis.call('HDEL', actions, id)
  redis.call('HDEL', state, id)
  redis.call('ZREM', stack, id)
  for _, slot in ipairs({directive, standing}) do
    if redis.call('GET', slot) == id then redis.call('DEL', slot) end
  end
  local held = redis.call('HGETALL', inflight)
  for i = 1, #held, 2 do
    local ok, lease = pcall(cjson.decode, held[i + 1])
    if held[i] == token or (ok and type(lease) == 'table' and lease.id == id) then
      end_lease(inflight, leases, held[i], session .. '/' .. held[i])
    end
  end
elseif what == 'lease' then
  end_lease(inflight, leases, field, session .. '/' .. field)
  -- the ids accounted for: stacked, in a slot, or held by a lease that still parses
  local known = {}
  for _, x in ipairs(redis.call('ZRANGE', stack, 0, -1)) do known[x] = true end
  for _, slot in ipairs({directive, standing}) do
    local x = redis.call('GET', slot)
    if x then known[x] = true end
  end
  for _, held in ipairs(redis.call('HVALS', inflight)) do
    local ok, lease = pcall(cjson.decode, held)
    if ok and type(lease) == 'table' and lease.id then known[lease.id] = true end
  end
  for _, x in ipairs(redis.call('HKEYS', actions)) do
    if not known[x] then
      -- a slot's id (directive or standing handler: the same prefix) to the directive slot
      local kind = string.sub(x, 1, 10) == 'directive:' and 'directive' or 'action'
      put_back(stack, directive, actions, state, kind, x, false)
      id = x
    end
  end
end
parked.id = id
local entry = cjson.encode(parked)
if spec_json then entry = string.sub(entry, 1, -2) .. ',"spec":' .. spec .. '}' end
redis.call('LPUSH', dead, entry)
if reply ~= '' then
  send_reply(replies, reply, reply_ttl_s)
end
history(hist, maxlen, EVENT.PARKED, 'id', id, 'what', what, 'reason', reason)
return 1
