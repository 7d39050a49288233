-- register: a dramatiq worker process keeps its pool live (broker/pools.py): the pool's handler
-- names, and the process's own entry among the live pools, expiring ttl ms from now; entries
-- of processes that died long ago go. Tiny, and run while Redis is full (allow-oom): a pool
-- that dropped out while Redis refused writes would leave stages told "no live worker" then,
-- and for a while after memory is back.
-- KEYS[1] pools (hash pool -> JSON list of its handler names)
-- KEYS[2] live (zset "<pool>/<instance>" -> expiry ms)
-- ARGV[1] pool  ARGV[2] handler names (JSON list)  ARGV[3] member "<pool>/<instance>"
-- ARGV[4] ttl ms
-- Returns: the expiry written, server ms.
local pools, live = KEYS[1], KEYS[2]
local pool, names, member, ttl_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local ttl = tonumber(ttl_ms)
redis.call('HSET', pools, pool, names)
redis.call('ZADD', live, now + ttl, member)
redis.call('ZREMRANGEBYSCORE', live, '-inf', now - 10 * ttl)
return now + ttl
