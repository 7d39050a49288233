-- name: claim_run
-- Hold a session's agent-framework run for one process (a lease), so that a run is continued once
-- however many processes resume it at the same moment. A fresh claim (run()) starts an empty
-- record; a resume claims the record of a paused run and reads it.
-- flags: none
-- roles: producer, serve
-- KEYS
--   run       the session's run (hash)
--   sessions  the partition's sessions (hash: owner records)
-- ARGV
--   session
--   tenant
--   token     lease token
--   lease_ms  lease ms
--   fresh     "1" for a fresh run, "" for a resume
--   ttl_ms    the record's ttl ms
-- Returns: {RUN.FOREIGN} another tenant's session or run; {RUN.NONE} no paused run (a resume);
-- {RUN.BUSY, ms} another process holds it for ms more; {RUN.PAUSED} a fresh run in a session
-- whose run is paused; {RUN.CLAIMED, framework, state, calls, out id, text, ...} claimed (a
-- fresh claim: empty framework, state and calls).
redis.replicate_commands()
check_types({[run] = 'hash', [sessions] = 'hash'})
local owner = redis.call('HGET', sessions, session)
if owner and owner ~= '' and owner ~= tenant then
  return {RUN.FOREIGN}
end
-- paused: save_run.lua wrote what it came to (its adapter; the state may be empty)
local held = redis.call('HMGET', run, 'tenant', 'lease', 'until', 'framework')
if held[1] and held[1] ~= tenant then
  return {RUN.FOREIGN}
end
local now = now_ms()
if held[2] and held[2] ~= '' and tonumber(held[3] or 0) > now then
  return {RUN.BUSY, tonumber(held[3]) - now}
end
local paused = held[4] and held[4] ~= ''
if fresh == '1' then
  if paused then return {RUN.PAUSED} end
  redis.call('DEL', run)
  redis.call('HSET', run, 'tenant', tenant, 'lease', token, 'until', now + lease_ms)
  redis.call('PEXPIRE', run, ttl_ms)
  return {RUN.CLAIMED, '', '', ''}
end
if not paused then return {RUN.NONE} end
redis.call('HSET', run, 'lease', token, 'until', now + lease_ms)
local out = {RUN.CLAIMED}
local got = redis.call('HMGET', run, 'framework', 'state', 'calls')
out[2], out[3], out[4] = got[1] or '', got[2], got[3] or '[]'
local fields = redis.call('HGETALL', run)
for i = 1, #fields, 2 do
  if string.sub(fields[i], 1, 4) == 'out:' then
    out[#out + 1] = string.sub(fields[i], 5)
    out[#out + 1] = fields[i + 1]
  end
end
return out
