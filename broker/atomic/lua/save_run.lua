-- save_run: what a claimed run came to, written by the process that holds its lease: paused
-- (the framework's state and the calls it waits for, kept for any process to resume) or done
-- (the record goes). Fenced: a process whose lease another took since changes nothing.
-- KEYS[1] the session's run (hash)
-- ARGV[1] lease token   ARGV[2] "1" when done   ARGV[3] framework   ARGV[4] state
-- ARGV[5] calls JSON (a list of {call, tool, id, label})   ARGV[6] the record's ttl ms
-- Returns: 1 when written, 0 when the lease is not this token's any more.
local run = KEYS[1]
local token, done, framework = ARGV[1], ARGV[2], ARGV[3]
local state, calls, ttl_ms = ARGV[4], ARGV[5], ARGV[6]
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
