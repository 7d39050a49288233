-- beat: a long-lived loop of a worker process says it has just gone round (see broker/loops.py).
-- The process's hash expires unless its pulse keeps it alive, so a killed process drops out of
-- `pending-actions health` on its own; a live process keeps its loops' beats, the stale included.
-- KEYS[1] procs (zset: process name -> last beat ms)  KEYS[2] the process's beats (hash)
-- ARGV[1] process name  ARGV[2] loop name ("" for a pulse that only keeps the process alive)
-- ARGV[3] the loop's interval ms (a beat older than this is late)  ARGV[4] process ttl ms
-- ARGV[5] JSON about the process (host, pid, role)
-- Returns: the server time of the beat in ms.
local now = now_ms()
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[2], '{"at":' .. now .. ',"every":' .. ARGV[3] .. '}')
end
redis.call('HSET', KEYS[2], '', ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('ZADD', KEYS[1], now, ARGV[1])
-- processes gone for a day leave the index
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 86400000)
return now
