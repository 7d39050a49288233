-- park: move a record of a session that does not parse (a spec, its counters, a lease) out of
-- the way, onto the session's dead-letter list with its raw bytes and the reason, so that the
-- session and every other one carry on. Never loses an action: parking a spec dead-letters the
-- action itself (with its raw spec); parking a lease puts the action it held back where it was
-- (found as the one spec neither stacked, in a slot, nor held by another lease).
-- KEYS[1] actions (hash)  KEYS[2] state (hash)  KEYS[3] inflight (hash)
-- KEYS[4] stack (zset: the lowest score is the head)
-- KEYS[5] directive (string)  KEYS[6] standing (string)  KEYS[7] dead (list)
-- KEYS[8] history (stream)  KEYS[9] reply (list; a request's, or any key of the session)
-- KEYS[10] the partition's lease index (zset): a lease ended here leaves it too
-- ARGV[1] what: "spec" | "state" | "lease"  ARGV[2] field: action id (spec, state) or token
-- ARGV[3] the raw bytes as read by the caller (parked only if the record still holds them)
-- ARGV[4] the raw bytes as JSON-safe text  ARGV[5] reason  ARGV[6] history maxlen
-- ARGV[7] reply JSON for a resolver waiting on it ("" for none)  ARGV[8] reply ttl s
-- ARGV[9] lease token to end with a parked spec ("" for none)
-- ARGV[10] session (a lease's index member is "<session>/<token>")
-- Returns: 1 when parked, 0 when the record had changed or gone meanwhile.
local hash = ({spec = KEYS[1], state = KEYS[2], lease = KEYS[3]})[ARGV[1]]
if redis.call('HGET', hash, ARGV[2]) ~= ARGV[3] then
  return 0
end
local now = now_ms()
local id = ARGV[1] == 'lease' and '' or ARGV[2]
redis.call('HDEL', hash, ARGV[2])
if ARGV[1] == 'spec' then
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[4], id)
  for _, slot in ipairs({KEYS[5], KEYS[6]}) do
    if redis.call('GET', slot) == id then redis.call('DEL', slot) end
  end
  if ARGV[9] ~= '' then
    redis.call('HDEL', KEYS[3], ARGV[9])
    redis.call('ZREM', KEYS[10], ARGV[10] .. '/' .. ARGV[9])
  end
elseif ARGV[1] == 'lease' then
  redis.call('ZREM', KEYS[10], ARGV[10] .. '/' .. ARGV[2])
  -- the ids accounted for: stacked, in a slot, or held by a lease that still parses
  local known = {}
  for _, x in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do known[x] = true end
  for _, slot in ipairs({KEYS[5], KEYS[6]}) do
    local x = redis.call('GET', slot)
    if x then known[x] = true end
  end
  for _, raw in ipairs(redis.call('HVALS', KEYS[3])) do
    local ok, lease = pcall(cjson.decode, raw)
    if ok and type(lease) == 'table' and lease.id then known[lease.id] = true end
  end
  for _, x in ipairs(redis.call('HKEYS', KEYS[1])) do
    if not known[x] then
      if string.sub(x, 1, 10) == 'directive:' then
        redis.call('SET', KEYS[5], x, 'NX')
      else
        push_head(KEYS[4], {x})
      end
      id = x
    end
  end
end
redis.call('LPUSH', KEYS[7], cjson.encode({id = id, reason = 'unreadable ' .. ARGV[1] ..
  ': ' .. ARGV[5], poison = ARGV[1], field = ARGV[2], raw = ARGV[4], at = now}))
if ARGV[7] ~= '' then
  redis.call('RPUSH', KEYS[9], ARGV[7])
  redis.call('EXPIRE', KEYS[9], ARGV[8])
end
history(KEYS[8], ARGV[6], EVENT.PARKED, 'id', id, 'what', ARGV[1], 'reason', ARGV[5])
return 1
