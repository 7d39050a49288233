-- begin: a handler task claims its attempt. Fences duplicate and late deliveries: only the
-- first delivery of a live lease gets "ok"; it also extends the lease for the run.
-- KEYS[1] inflight (hash)  KEYS[2] actions (hash)  KEYS[3] state (hash)
-- ARGV[1] lease token      ARGV[2] lease ms
-- Returns: {"ok", spec JSON, state JSON, lease JSON} | {"stale"} (no such lease)
--          | {"running"} (already claimed) | {"gone", lease JSON} (spec replaced meanwhile)
redis.replicate_commands()
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {'stale'}
end
local lease = cjson.decode(raw)
if lease.state ~= 'dispatched' then
  return {'running'}
end
local spec = redis.call('HGET', KEYS[2], lease.id)
if not spec then
  return {'gone', raw}
end
local t = redis.call('TIME')
lease.state = 'running'
lease.deadline = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[2])
raw = cjson.encode(lease)
redis.call('HSET', KEYS[1], ARGV[1], raw)
local st = redis.call('HGET', KEYS[3], lease.id) or '{"attempts":0,"stalls":0}'
return {'ok', spec, st, raw}
