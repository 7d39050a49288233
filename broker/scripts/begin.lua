-- begin: a handler task claims its attempt. Fences duplicate and late deliveries: only the
-- first delivery of a live lease gets OK; it also extends the lease for the run.
-- KEYS[1] inflight (hash)  KEYS[2] actions (hash)  KEYS[3] state (hash)
-- ARGV[1] lease token      ARGV[2] lease ms
-- Returns: {BEGIN.OK, spec JSON, state JSON, lease JSON} | {BEGIN.STALE} (no such lease)
--          | {BEGIN.RUNNING} (already claimed) | {BEGIN.GONE, lease JSON} (spec replaced)
redis.replicate_commands()
check_types({'hash', 'hash', 'hash'})
local lease, raw = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  return {BEGIN.STALE}
end
if lease.state ~= 'dispatched' then
  return {BEGIN.RUNNING}
end
local spec = redis.call('HGET', KEYS[2], lease.id)
if not spec then
  return {BEGIN.GONE, raw}
end
counters(KEYS[3], lease.id)  -- POISON before the write below
lease.state = 'running'
lease.deadline = now_ms() + tonumber(ARGV[2])
raw = cjson.encode(lease)
redis.call('HSET', KEYS[1], ARGV[1], raw)
local st = redis.call('HGET', KEYS[3], lease.id) or NEW_STATE
return {BEGIN.OK, spec, st, raw}
