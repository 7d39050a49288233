-- beat: a long-lived loop of a worker process says it has just gone round (see broker/loops.py).
-- The process's hash expires unless its pulse keeps it alive, so a killed process drops out of
-- `pending-actions health` on its own; a live process keeps its loops' beats, the stale included.
-- KEYS[1] procs (zset: process name -> last beat ms)  KEYS[2] the process's beats (hash)
-- ARGV[1] process name  ARGV[2] loop name ("" for a pulse that only keeps the process alive)
-- ARGV[3] the loop's interval ms (a beat older than this is late)  ARGV[4] process ttl ms
-- ARGV[5] JSON about the process (host, pid, role)
-- Returns: the server time of the beat in ms.
local procs, beats = KEYS[1], KEYS[2]
local proc, loop, every_ms, ttl_ms, info = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
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
