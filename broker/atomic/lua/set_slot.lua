-- name: set_slot
-- Set the session's directive or standing handler, replacing any previous one.
-- flags: none
-- roles: producer, serve
-- KEYS
--   slot     (string: directive or standing)
--   actions  (hash)
--   state    (hash)
--   hist     history (stream)
-- ARGV
--   action_id  new id
--   spec       JSON
--   event      (EVENT.DIRECTIVE_SET | EVENT.STANDING_SET)
--   maxlen     history maxlen
-- Returns: the replaced id, or false when the slot was empty.
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
