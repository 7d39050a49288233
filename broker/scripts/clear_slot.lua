-- clear_slot: remove the session's directive or standing handler.
-- KEYS[1] slot (string)   KEYS[2] actions (hash)   KEYS[3] state (hash)   KEYS[4] history
-- ARGV[1] event (EVENT.DIRECTIVE_CLEARED | EVENT.STANDING_CLEARED)   ARGV[2] history maxlen
-- Returns: the removed id, or false when the slot was empty.
check_types({'string', 'hash', 'hash', 'stream'})
local old = redis.call('GET', KEYS[1])
if not old then
  return false
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[2], old)
redis.call('HDEL', KEYS[3], old)
history(KEYS[4], ARGV[2], ARGV[1], 'id', old)
return old
