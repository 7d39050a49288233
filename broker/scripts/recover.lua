-- recover: an attempt whose lease expired goes back where it was. If a handler was running
-- (its worker died or hung) that is a stall: stalls + 1, and at max_stalls the action is moved
-- to the dead-letter list instead. If no worker ever started it, it just goes back.
-- The resolver waiting on it gets the matching error reply. No-op unless the lease is expired.
-- KEYS[1] inflight (hash)  KEYS[2] stack (list)  KEYS[3] directive (string)
-- KEYS[4] actions (hash)   KEYS[5] state (hash)  KEYS[6] history (stream)
-- KEYS[7] dead (list)      KEYS[8] reply (list)
-- ARGV[1] lease token  ARGV[2] max stalls  ARGV[3] reply ttl s  ARGV[4] history maxlen
-- ARGV[5] reply JSON when returned to pending  ARGV[6] reply JSON when dead-lettered
-- ARGV[7] reply JSON when no worker started it
-- Returns: {outcome, deadline ms}: outcome 0 no such lease (finished or recovered already),
-- 1 returned after a stall, 2 dead-lettered, 3 returned unstarted, 4 still live (nothing
-- done; the deadline says when to look again).
redis.replicate_commands()
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return {0, 0}
end
local lease = cjson.decode(raw)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if lease.deadline > now then
  return {4, lease.deadline}
end
redis.call('HDEL', KEYS[1], ARGV[1])
local spec = redis.call('HGET', KEYS[4], lease.id)
local outcome = 1
if lease.state == 'dispatched' then
  outcome = 3
end
if spec then
  local st = cjson.decode(redis.call('HGET', KEYS[5], lease.id) or '{"attempts":0,"stalls":0}')
  if outcome == 1 then
    st.stalls = (st.stalls or 0) + 1
    st.last_error = 'worker lost during attempt ' .. lease.attempt
  else
    st.last_error = 'no worker started attempt ' .. lease.attempt
  end
  if outcome == 1 and lease.kind ~= 'standing' and st.stalls >= tonumber(ARGV[2]) then
    outcome = 2
    redis.call('LPUSH', KEYS[7], '{"id":' .. cjson.encode(lease.id) ..
      ',"reason":' .. cjson.encode('lease lost ' .. st.stalls .. ' times; last attempt ' ..
      lease.attempt) .. ',"stalls":' .. st.stalls .. ',"attempts":' .. st.attempts ..
      ',"at":' .. now .. ',"spec":' .. spec .. '}')
    redis.call('HDEL', KEYS[4], lease.id)
    redis.call('HDEL', KEYS[5], lease.id)
  else
    redis.call('HSET', KEYS[5], lease.id, cjson.encode(st))
    if lease.kind == 'action' then
      redis.call('LPUSH', KEYS[2], lease.id)
    elseif lease.kind == 'directive' and not redis.call('SET', KEYS[3], lease.id, 'NX') then
      redis.call('HDEL', KEYS[4], lease.id)
      redis.call('HDEL', KEYS[5], lease.id)
    end
  end
end
redis.call('RPUSH', KEYS[8], ARGV[4 + outcome])
redis.call('EXPIRE', KEYS[8], ARGV[3])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[4], '*', 'event',
  outcome == 2 and 'dead-lettered' or 'recovered', 'id', lease.id, 'attempt', lease.attempt,
  'started', outcome == 3 and 'no' or 'yes',
  'request', lease.req)
return {outcome, lease.deadline}
