-- stage: push a new pending action on the head of its session's stack. Its counters (state
-- hash) are written at its first take: an action that has none is at attempt 0, no stalls,
-- which saves a field, and for a session's first action a whole key, per pending action.
-- KEYS[1] stack (list)   KEYS[2] actions (hash)   KEYS[3] history (stream)
-- KEYS[4] the partition's sessions (set)
-- ARGV[1] action id      ARGV[2] spec JSON        ARGV[3] history maxlen   ARGV[4] session
-- Returns: the stack depth after the push, or 0 when the id is staged already (a retried call
-- whose first try went through: ids come from a counter, so it is ours) and nothing changed.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return 0
end
local depth = redis.call('LPUSH', KEYS[1], ARGV[1])
if depth == 1 then
  redis.call('SADD', KEYS[4], ARGV[4])
end
history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1])
return depth
