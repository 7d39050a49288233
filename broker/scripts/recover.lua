-- recover: an attempt whose lease expired (its worker died or hung) goes back where it was,
-- with stalls + 1; at max_stalls the action is moved to the dead-letter list instead.
-- The resolver waiting on it gets the matching error reply. No-op unless the lease is expired.
-- KEYS[1] inflight (hash)  KEYS[2] stack (list)  KEYS[3] directive (string)
-- KEYS[4] actions (hash)   KEYS[5] state (hash)  KEYS[6] history (stream)
-- KEYS[7] dead (list)      KEYS[8] reply (list)
-- ARGV[1] lease token  ARGV[2] max stalls  ARGV[3] reply ttl s  ARGV[4] history maxlen
-- ARGV[5] reply JSON when returned to pending  ARGV[6] reply JSON when dead-lettered
-- Returns: 0 nothing to do, 1 returned to pending, 2 dead-lettered.
redis.replicate_commands()
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
local lease = cjson.decode(raw)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if lease.deadline > now then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
local spec = redis.call('HGET', KEYS[4], lease.id)
local outcome = 1
if spec then
  local st = cjson.decode(redis.call('HGET', KEYS[5], lease.id) or '{"attempts":0,"stalls":0}')
  st.stalls = (st.stalls or 0) + 1
  st.last_error = 'lease expired during attempt ' .. lease.attempt
  if lease.kind ~= 'standing' and st.stalls >= tonumber(ARGV[2]) then
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
  'request', lease.req)
return outcome
