-- name: expire
-- End one action whose ttl has passed, found by the recovery loop through its partition's expiries.
-- No handler runs; it leaves the stack, its spec and counters go, the history says "expired". One
-- taken before its ttl passed is left to its attempt (if that fails and puts it back, a later look
-- ends it); its entry stays as it is, since its score is what every reader checks.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   stack     (zset)
--   actions   (hash)
--   state     (hash)
--   expiries  the partition's expiries (zset "<session>/<id>" -> expiry ms)
--   expired   (zset)
--   hist      history (stream)
-- ARGV
--   action_id  action id
--   maxlen     history maxlen
--   memory_ms  expired memory ms
--   session
-- Returns: {outcome, ms[, spec]}, outcome one of EXPIRE: ENDED (then also the spec it ended,
-- whose trace context the expiry's span links to), GONE (resolved or ended already: its
-- entry is gone too), IN_FLIGHT (taken; look again later), LATER (not due yet: ms is its
-- expiry time)
redis.replicate_commands()
local now = now_ms()
local member = session .. '/' .. action_id
local at = redis.call('ZSCORE', expiries, member)
if not at then
  return {EXPIRE.GONE, 0}
end
if tonumber(at) > now then
  return {EXPIRE.LATER, tonumber(at)}
end
local spec = redis.call('HGET', actions, action_id)
if not spec then
  redis.call('ZREM', expiries, member)
  return {EXPIRE.GONE, 0}
end
if redis.call('ZREM', stack, action_id) == 0 then
  return {EXPIRE.IN_FLIGHT, 0}
end
end_expired(actions, state, expiries, member, expired, hist, maxlen, memory_ms, action_id, now)
return {EXPIRE.ENDED, 0, spec}
