-- name: clear_slot
-- Remove the session's directive or standing handler.
-- flags: allow-oom
-- roles: producer, serve
-- KEYS
--   slot     (string)
--   actions  (hash)
--   state    (hash)
--   hist     history
-- ARGV
--   event   (EVENT.DIRECTIVE_CLEARED | EVENT.STANDING_CLEARED)
--   maxlen  history maxlen
-- Returns: the removed id, or false when the slot was empty.
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
