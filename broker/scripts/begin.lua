-- begin: a handler task claims its attempt. Fences duplicate and late deliveries: only the
-- first delivery of a live lease gets OK; it also extends the lease for the run (and its
-- index entry). The claim names its claimant, so the same claim sent again (to the master
-- that took over after a failover, say) is told OK again, and any other RUNNING.
-- KEYS[1] inflight (hash)  KEYS[2] actions (hash)  KEYS[3] state (hash)
-- KEYS[4] the partition's lease index (zset)
-- ARGV[1] lease token      ARGV[2] lease ms      ARGV[3] index member "<session>/<token>"
-- ARGV[4] claimant (one per delivery run)
-- Returns: {BEGIN.OK, spec JSON, state JSON, lease JSON} | {BEGIN.STALE} (no such lease)
--          | {BEGIN.RUNNING} (already claimed) | {BEGIN.GONE, lease JSON} (spec replaced)
redis.replicate_commands()
check_types({'hash', 'hash', 'hash', 'zset'})
local lease, raw = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  return {BEGIN.STALE}
end
if lease.state ~= 'dispatched' and lease.claimant ~= ARGV[4] then
  return {BEGIN.RUNNING}
end
local spec = redis.call('HGET', KEYS[2], lease.id)
if not spec then
  return {BEGIN.GONE, raw}
end
counters(KEYS[3], lease.id)  -- POISON before the write below
lease.state = 'running'
lease.claimant = ARGV[4]
lease.deadline = now_ms() + tonumber(ARGV[2])
raw = cjson.encode(lease)
redis.call('HSET', KEYS[1], ARGV[1], raw)
redis.call('ZADD', KEYS[4], lease.deadline, ARGV[3])
local st = redis.call('HGET', KEYS[3], lease.id) or NEW_STATE
return {BEGIN.OK, spec, st, raw}
