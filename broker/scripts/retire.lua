-- retire: what a finished session leaves (its history, its tenant claim) expires after the
-- retention, and a session with no keys left says so, to be dropped from the sessions sets.
-- A session with anything pending, in flight, in a slot or dead-lettered keeps all its keys:
-- its actions hash holds every staged, slotted and in-flight spec, its dead list the rest.
-- stage.lua and set_slot.lua make the keys persistent again.
-- KEYS[1] actions (hash)  KEYS[2] dead (list)  KEYS[3] history (stream)  KEYS[4] tenant
-- KEYS[5] stack (list: only ids of specs gone, when the actions hash is empty)
-- ARGV[1] retention ms
-- Returns: 2 when the session has no keys left, 1 when its leftovers are set to expire (or
-- were already), 0 when it is live.
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  redis.call('PERSIST', KEYS[3])
  redis.call('PERSIST', KEYS[4])
  return 0
end
redis.call('DEL', KEYS[5])
if redis.call('EXISTS', KEYS[3], KEYS[4]) == 0 then
  return 2
end
for _, key in ipairs({KEYS[3], KEYS[4]}) do
  if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, ARGV[1]) end
end
return 1
