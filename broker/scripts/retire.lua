-- retire: what a finished session leaves (its history) expires after the retention, and a
-- session with no keys left leaves its partition's sessions hash, its tenant claim with it (in
-- the same step, so a stage cannot come in between and find its claim gone).
-- A session with anything pending, in flight, in a slot or dead-lettered keeps all its keys:
-- its actions hash holds every staged, slotted and in-flight spec, its dead list the rest.
-- stage.lua and set_slot.lua make the history persistent again.
-- KEYS[1] actions (hash)  KEYS[2] dead (list)  KEYS[3] history (stream)
-- KEYS[4] the partition's sessions (hash)
-- KEYS[5] stack (zset: only ids of specs gone, when the actions hash is empty)
-- KEYS[6] the per-session expiry zset an older version kept (Keys.legacy_expiry): read by
--         nothing now, deleted with the stack
-- ARGV[1] retention ms  ARGV[2] session
-- Returns: 2 when the session had no keys left (and left the sessions hash), 1 when its
-- history is set to expire (or was already), 0 when it is live.
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then
  redis.call('PERSIST', KEYS[3])
  return 0
end
redis.call('DEL', KEYS[5], KEYS[6])
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('HDEL', KEYS[4], ARGV[2])
  return 2
end
if redis.call('PTTL', KEYS[3]) == -1 then redis.call('PEXPIRE', KEYS[3], ARGV[1]) end
return 1
