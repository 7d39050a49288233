-- renew: extend the lease of a running attempt (called periodically while its handler runs).
-- KEYS[1] inflight (hash)   KEYS[2] the partition's lease index (zset)
-- ARGV[1] lease token   ARGV[2] lease ms   ARGV[3] index member "<session>/<token>"
-- Returns: the new deadline in ms, or 0 when the lease is gone (recovered or finished).
redis.replicate_commands()
check_types({'hash', 'zset'})
local lease = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  return 0
end
lease.deadline = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(lease))
redis.call('ZADD', KEYS[2], lease.deadline, ARGV[3])
return lease.deadline
