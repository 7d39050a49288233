-- name: register
-- A dramatiq worker process keeps its pool live (broker/routing.py): the pool's handler names, and
-- the process's own entry among the live pools, expiring ttl ms from now; entries of processes that
-- died long ago go. Tiny, and run while Redis is full (allow-oom): a pool that dropped out while
-- Redis refused writes would leave stages told "no live worker" then, and for a while after memory
-- is back.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   pools  (hash pool -> JSON list of its handler names)
--   live   (zset "<pool>/<instance>" -> expiry ms)
-- ARGV
--   pool
--   names   handler names (JSON list)
--   member  "<pool>/<instance>"
--   ttl_ms  ttl ms
-- Returns: the expiry written, server ms.
local now = now_ms()
local ttl = tonumber(ttl_ms)
redis.call('HSET', pools, pool, names)
redis.call('ZADD', live, now + ttl, member)
redis.call('ZREMRANGEBYSCORE', live, '-inf', now - 10 * ttl)
return now + ttl
