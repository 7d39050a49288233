-- stage: push a new pending action on the head of its session's stack. Its counters (state
-- hash) are written at its first take: an action that has none is at attempt 0, no stalls,
-- which saves a field, and for a session's first action a whole key, per pending action.
-- The session's first stage makes it its tenant's (and lists it in its partition's sessions);
-- a stage for another tenant is refused.
-- KEYS[1] stack (list)   KEYS[2] actions (hash)   KEYS[3] history (stream)
-- KEYS[4] tenant (string)  KEYS[5] expiry (zset: id -> expiry ms, for actions staged with a ttl)
-- KEYS[6] the partition's sessions (set)   KEYS[7] the partition's expiries (zset)
-- ARGV[1] action id      ARGV[2] spec JSON        ARGV[3] history maxlen   ARGV[4] tenant
-- ARGV[5] ttl in ms, "" for none: the expiry is reckoned on the server's clock, so a client's
-- clock can be off without moving it
-- ARGV[6] session (the expiries member is "<session>/<id>")
-- Returns: the stack depth after the push, 0 when the id is staged already (a retried call
-- whose first try went through: ids come from a counter, so it is ours) and nothing changed,
-- -1 when the session belongs to another tenant (nothing changed).
check_types({'list', 'hash', 'stream', 'string', 'zset'})
redis.replicate_commands()
local owner = redis.call('GET', KEYS[4])
if owner and owner ~= ARGV[4] then
  return -1
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return 0
end
if not owner then
  redis.call('SET', KEYS[4], ARGV[4])
  redis.call('SADD', KEYS[6], ARGV[6])
end
-- live again: what retire.lua set to expire stays (PERSIST is a no-op on a key without a ttl)
redis.call('PERSIST', KEYS[4])
redis.call('PERSIST', KEYS[3])
local depth = redis.call('LPUSH', KEYS[1], ARGV[1])
if ARGV[5] ~= '' then
  local at = now_ms() + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[5], at, ARGV[1])
  redis.call('ZADD', KEYS[7], at, ARGV[6] .. '/' .. ARGV[1])
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1], 'expires_at', at)
else
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1])
end
return depth
