-- renew: extend the lease of a running attempt (called periodically while its handler runs).
-- KEYS[1] inflight (hash)   KEYS[2] the partition's lease index (zset)
-- ARGV[1] lease token   ARGV[2] lease ms   ARGV[3] index member "<session>/<token>"
-- Returns: the new deadline in ms, or 0 when the lease is gone (recovered or finished).
local inflight, leases = KEYS[1], KEYS[2]
local token, lease_ms, member = ARGV[1], ARGV[2], ARGV[3]
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
