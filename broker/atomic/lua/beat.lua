-- name: beat
-- A long-lived loop of a worker process says it has just gone round (see broker/loops.py). The
-- process's hash expires unless its pulse keeps it alive, so a killed process drops out of
-- `pending-actions health` on its own; a live process keeps its loops' beats, the stale included.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   procs  (zset: process name -> last beat ms)
--   beats  the process's beats (hash)
-- ARGV
--   proc      process name
--   loop      name ("" for a pulse that only keeps the process alive)
--   every_ms  the loop's interval ms (a beat older than this is late)
--   ttl_ms    process ttl ms
--   info      JSON about the process (host, pid, role)
-- Returns: the server time of the beat in ms.
local now = now_ms()
if loop ~= '' then
  redis.call('HSET', beats, loop, '{"at":' .. now .. ',"every":' .. every_ms .. '}')
end
redis.call('HSET', beats, '', info)
redis.call('PEXPIRE', beats, ttl_ms)
redis.call('ZADD', procs, now, proc)
-- processes gone for a day leave the index
redis.call('ZREMRANGEBYSCORE', procs, '-inf', now - 86400000)
return now
