-- stage: push a new pending action on the head of its session's stack. Its counters (state
-- hash) are written at its first take: an action that has none is at attempt 0, no stalls,
-- which saves a field, and for a session's first action a whole key, per pending action.
-- KEYS[1] stack (list)   KEYS[2] actions (hash)   KEYS[3] history (stream)
-- KEYS[4] expiry (zset: id -> expiry ms, for actions staged with a ttl)
-- ARGV[1] action id      ARGV[2] spec JSON        ARGV[3] history maxlen
-- ARGV[4] ttl in ms, "" for none: the expiry is reckoned on the server's clock, so a client's
-- clock can be off without moving it
-- Returns: the stack depth after the push, or 0 when the id is staged already (a retried call
-- whose first try went through: ids come from a counter, so it is ours) and nothing changed.
redis.replicate_commands()
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local depth = redis.call('LPUSH', KEYS[1], ARGV[1])
if ARGV[4] ~= '' then
  local at = now_ms() + tonumber(ARGV[4])
  redis.call('ZADD', KEYS[4], at, ARGV[1])
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1], 'expires_at', at)
else
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1])
end
return depth
