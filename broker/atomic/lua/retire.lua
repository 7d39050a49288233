-- name: retire
-- For a page of one partition's sessions, what a finished session leaves (its history) expires
-- after the retention, and a session with no keys left leaves its partition's sessions hash (its
-- owner record) and its tenant's index, in the same step, so a stage cannot come in between and
-- find its record gone or its index entry left behind. A session with anything pending, in flight,
-- in a slot or dead-lettered keeps all its keys: its actions hash holds every staged, slotted and
-- in-flight spec, its dead list the rest. Such a session is only looked at (one EXISTS): the
-- scripts that make a session live again (stage.lua, set_slot.lua) make its history persistent
-- themselves, and a session is never made to expire while live, since this script checks and
-- expires in one step.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   sessions         the partition's sessions (hash)
--   ...session_keys  five per session, in ARGV's order: actions (hash), dead (list), history
--                      (stream), stack (zset: only ids of specs gone, when the actions hash is
--                      empty), the index of the tenant the session was read with (set)
-- ARGV
--   retention_ms     retention ms
--   ...sessions      two per session (all of sessions's partition): the session and the tenant its
--                      field held when read ("" for none yet): a claimed session's tenant never
--                      changes, and one that changed since (a first stage after a slot) is live
-- Returns: per session, 2 when it had no keys left (and left the sessions hash), 1 when its
-- history is set to expire (or was already), 0 when it is live.
local out = {}
for i = sessions_at, #ARGV, 2 do
  local k = session_keys_at + 5 * (i - sessions_at) / 2
  local actions, dead, hist, stack, index = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3],
    KEYS[k + 4]
  local session, tenant = ARGV[i], ARGV[i + 1]
  local owner = redis.call('HGET', sessions, session)
  if redis.call('EXISTS', actions, dead) > 0 or (owner and owner ~= tenant) then
    out[#out + 1] = 0
  else
    redis.call('DEL', stack)
    if redis.call('EXISTS', hist) == 0 then
      redis.call('HDEL', sessions, session)
      redis.call('SREM', index, session)
      out[#out + 1] = 2
    else
      if redis.call('PTTL', hist) == -1 then redis.call('PEXPIRE', hist, retention_ms) end
      out[#out + 1] = 1
    end
  end
end
return out
