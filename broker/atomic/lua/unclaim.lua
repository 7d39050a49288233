-- name: unclaim
-- Hand back an attempt that a delivery claimed early (on its consumer thread, see workers/early.py)
-- but will not run, because its worker is shutting down with the task still queued in memory: the
-- lease is dispatched again, with a dispatch timeout, so the task's next delivery claims it as if
-- this one had never begun (no stall is counted). Only the claimant's own claim is undone: a lease
-- someone else holds, or that is gone, is left alone.
-- Every key is read before the first write (the index, written with call_on): no TYPE checks.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight  (hash)
--   leases    the partition's lease index (zset)
-- ARGV
--   token        lease token
--   claimant
--   dispatch_ms  dispatch timeout ms
--   member       index member "<session>/<token>"
-- Returns: 1 when handed back, 0 when the lease is gone or not this claimant's
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
