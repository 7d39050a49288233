-- stage: push a new pending action on the head of its session's stack. Its counters (state
-- hash) are written at its first take: an action that has none is at attempt 0, no stalls,
-- which saves a field, and for a session's first action a whole key, per pending action.
-- KEYS[1] stack (list)   KEYS[2] actions (hash)   KEYS[3] history (stream)
-- ARGV[1] action id      ARGV[2] spec JSON        ARGV[3] history maxlen
-- Returns: the stack depth after the push, or an error reply "EXISTS" if the id is taken.
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return redis.error_reply('EXISTS ' .. ARGV[1])
end
local depth = redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'event', 'staged', 'id', ARGV[1])
return depth
