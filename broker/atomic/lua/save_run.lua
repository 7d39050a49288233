-- name: save_run
-- What a claimed run came to, written by the process that holds its lease: paused (the framework's
-- state and the calls it waits for, kept for any process to resume) or done (the record goes).
-- Fenced: a process whose lease another took since changes nothing.
-- flags: allow-oom
-- roles: producer, serve
-- KEYS
--   run  the session's run (hash)
-- ARGV
--   token      lease token
--   done       "1" when done
--   framework
--   state
--   calls      JSON (a list of {call, tool, id, label})
--   ttl_ms     the record's ttl ms
-- Returns: 1 when written, 0 when the lease is not this token's any more.
check_types({[run] = 'hash'})
if redis.call('HGET', run, 'lease') ~= token then
  return 0
end
if done == '1' then
  redis.call('DEL', run)
  return 1
end
-- the outcomes noted for calls this run no longer waits for are dropped; those of its calls
-- are kept (an action a policy applied at once may have ended before this write)
local waiting = {}
for _, call in ipairs(cjson.decode(calls)) do
  waiting['out:' .. call.id] = true
end
local fields = redis.call('HKEYS', run)
for _, field in ipairs(fields) do
  if string.sub(field, 1, 4) == 'out:' and not waiting[field] then
    redis.call('HDEL', run, field)
  end
end
redis.call('HSET', run, 'framework', framework, 'state', state, 'calls', calls, 'lease', '',
  'until', 0)
redis.call('PEXPIRE', run, ttl_ms)
return 1
