-- name: begin
-- A handler task claims its attempt. Fences duplicate and late deliveries: only the first delivery
-- of a live lease gets OK; it also extends the lease for the run (and its index entry). The claim
-- names its claimant, so the same claim sent again (to the master that took over after a failover,
-- say) is told OK again, and any other RUNNING.
-- Every key is read before the first write (the index, written with call_on): no TYPE checks.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight  (hash)
--   actions   (hash)
--   state     (hash)
--   leases    the partition's lease index (zset)
-- ARGV
--   token     lease token
--   lease_ms  lease ms
--   member    index member "<session>/<token>"
--   claimant  (one per delivery run)
-- Returns: {BEGIN.OK, spec JSON, counters JSON (attempts: this attempt's number), lease JSON}
--          | {BEGIN.STALE} (no such lease) | {BEGIN.RUNNING} (already claimed)
--          | {BEGIN.GONE, lease JSON} (spec replaced)
redis.replicate_commands()
local lease, raw = json_field('lease', inflight, token)
if not lease then
  return {BEGIN.STALE}
end
if lease.state ~= 'dispatched' and lease.claimant ~= claimant then
  return {BEGIN.RUNNING}
end
local spec = call_on('HGET', actions, lease.id)
if not spec then
  return {BEGIN.GONE, raw}
end
local st = lease_counters(state, lease)
lease.state = 'running'
lease.claimant = claimant
lease.deadline = now_ms() + tonumber(lease_ms)
raw = cjson.encode(lease)
call_on('ZADD', leases, lease.deadline, member)
redis.call('HSET', inflight, token, raw)
return {BEGIN.OK, spec, cjson.encode(st), raw}
