-- clear_slot: remove the session's directive or standing handler.
-- KEYS[1] slot (string)   KEYS[2] actions (hash)   KEYS[3] state (hash)   KEYS[4] history
-- ARGV[1] event (EVENT.DIRECTIVE_CLEARED | EVENT.STANDING_CLEARED)   ARGV[2] history maxlen
-- Returns: the removed id, or false when the slot was empty.
local slot, actions, state, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local event, maxlen = ARGV[1], ARGV[2]
check_types({[slot] = 'string', [actions] = 'hash', [state] = 'hash', [hist] = 'stream'})
local old = redis.call('GET', slot)
if not old then
  return false
end
redis.call('DEL', slot)
redis.call('HDEL', actions, old)
redis.call('HDEL', state, old)
history(hist, maxlen, event, 'id', old)
return old
