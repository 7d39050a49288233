-- set_slot: set the session's directive or standing handler, replacing any previous one.
-- KEYS[1] slot (string: directive or standing)   KEYS[2] actions (hash)   KEYS[3] state (hash)
-- KEYS[4] history (stream)
-- ARGV[1] new id   ARGV[2] spec JSON   ARGV[3] event (EVENT.DIRECTIVE_SET | EVENT.STANDING_SET)
-- ARGV[4] history maxlen
-- Returns: the replaced id, or false when the slot was empty.
check_types({'string', 'hash', 'hash', 'stream'})
local old = redis.call('GET', KEYS[1])
if old then
  redis.call('HDEL', KEYS[2], old)
  redis.call('HDEL', KEYS[3], old)
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PERSIST', KEYS[4])  -- live again (what retire.lua set to expire stays)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], NEW_STATE)
history(KEYS[4], ARGV[4], ARGV[3], 'id', ARGV[1])
return old
