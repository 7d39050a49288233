-- unclaim: hand back an attempt that a delivery claimed early (on its consumer thread, see
-- workers/early.py) but will not run, because its worker is shutting down with the task still
-- queued in memory: the lease is dispatched again, with a dispatch timeout, so the task's next
-- delivery claims it as if this one had never begun (no stall is counted). Only the claimant's
-- own claim is undone: a lease someone else holds, or that is gone, is left alone.
-- KEYS[1] inflight (hash)   KEYS[2] the partition's lease index (zset)
-- ARGV[1] lease token  ARGV[2] claimant  ARGV[3] dispatch timeout ms
-- ARGV[4] index member "<session>/<token>"
-- Returns: 1 when handed back, 0 when the lease is gone or not this claimant's
-- Every key is read before the first write (the index, written with call_on): no TYPE checks.
local inflight, leases = KEYS[1], KEYS[2]
local token, claimant, dispatch_ms, member = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
redis.replicate_commands()
local lease = json_field('lease', inflight, token)
if not lease or lease.state ~= 'running' or lease.claimant ~= claimant then
  return 0
end
lease.state = 'dispatched'
lease.claimant = nil
lease.deadline = now_ms() + tonumber(dispatch_ms)
call_on('ZADD', leases, lease.deadline, member)
redis.call('HSET', inflight, token, cjson.encode(lease))
return 1
