-- set_slot: set the session's directive or standing handler, replacing any previous one.
-- KEYS[1] slot (string: directive or standing)   KEYS[2] actions (hash)   KEYS[3] state (hash)
-- KEYS[4] history (stream)
-- ARGV[1] new id   ARGV[2] spec JSON   ARGV[3] event (EVENT.DIRECTIVE_SET | EVENT.STANDING_SET)
-- ARGV[4] history maxlen
-- Returns: the replaced id, or false when the slot was empty.
local slot, actions, state, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local action_id, spec, event, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
check_types({[slot] = 'string', [actions] = 'hash', [state] = 'hash', [hist] = 'stream'})
local old = redis.call('GET', slot)
if old then
  redis.call('HDEL', actions, old)
  redis.call('HDEL', state, old)
end
redis.call('SET', slot, action_id)
redis.call('PERSIST', hist)  -- live again (what retire.lua set to expire stays)
redis.call('HSET', actions, action_id, spec)
redis.call('HSET', state, action_id, NEW_STATE)
history(hist, maxlen, event, 'id', action_id)
return old
