-- renew: extend the lease of a running attempt (called periodically while its handler runs).
-- KEYS[1] inflight (hash)
-- ARGV[1] lease token   ARGV[2] lease ms
-- Returns: the new deadline in ms, or 0 when the lease is gone (recovered or finished).
redis.replicate_commands()
check_types({'hash'})
local lease = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  return 0
end
lease.deadline = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(lease))
return lease.deadline
