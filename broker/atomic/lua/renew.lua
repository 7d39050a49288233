-- name: renew
-- Extend the lease of a running attempt (called periodically while its handler runs).
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight  (hash)
--   leases    the partition's lease index (zset)
-- ARGV
--   token     lease token
--   lease_ms  lease ms
--   member    index member "<session>/<token>"
-- Returns: the new deadline in ms, or 0 when the lease is gone (recovered or finished).
redis.replicate_commands()
check_types({[inflight] = 'hash', [leases] = 'zset'})
local lease = json_field('lease', inflight, token)
if not lease then
  return 0
end
lease.deadline = now_ms() + tonumber(lease_ms)
redis.call('HSET', inflight, token, cjson.encode(lease))
redis.call('ZADD', leases, lease.deadline, member)
return lease.deadline
