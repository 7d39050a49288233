-- recover: an attempt whose lease expired goes back where it was. If a handler was running
-- (its worker died or hung) that is a stall: stalls + 1, and at max_stalls the action is moved
-- to the dead-letter list instead. If no worker ever started it, it just goes back.
-- The resolver waiting on it gets the matching error reply. No-op unless the lease is expired.
-- KEYS[1] inflight (hash)  KEYS[2] stack (zset: the lowest score is the head)
-- KEYS[3] directive (string)
-- KEYS[4] actions (hash)   KEYS[5] state (hash)  KEYS[6] history (stream)
-- KEYS[7] dead (list)      KEYS[8] reply (list)  KEYS[9] the partition's lease index (zset)
-- ARGV[1] lease token  ARGV[2] max stalls  ARGV[3] reply ttl s  ARGV[4] history maxlen
-- ARGV[5] reply JSON when returned after a stall  ARGV[6] reply JSON when dead-lettered
-- ARGV[7] reply JSON when no worker started it
-- ARGV[8] last_error when returned after a stall  ARGV[9] last_error when no worker started it
-- ARGV[10] index member "<session>/<token>"
-- Returns: {outcome, deadline ms}, outcome one of RECOVER: GONE (no such lease: finished or
-- recovered already), RETURNED, DEAD_LETTERED, UNSTARTED, or LIVE (nothing done; the deadline
-- says when to look again).
redis.replicate_commands()
check_types({'hash', 'zset', 'string', 'hash', 'hash', 'stream', 'list', 'list', 'zset'})
local lease = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  redis.call('ZREM', KEYS[9], ARGV[10])
  return {RECOVER.GONE, 0}
end
local now = now_ms()
if lease.deadline > now then
  redis.call('ZADD', KEYS[9], lease.deadline, ARGV[10])
  return {RECOVER.LIVE, lease.deadline}
end
local spec = redis.call('HGET', KEYS[4], lease.id)
local st = spec and counters(KEYS[5], lease.id)  -- POISON before the first write
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[9], ARGV[10])
local outcome = RECOVER.RETURNED
if lease.state == 'dispatched' then
  outcome = RECOVER.UNSTARTED
end
if spec then
  st.attempts = lease.attempt  -- take keeps the counters in the lease while in flight
  if outcome == RECOVER.RETURNED then
    st.stalls = (st.stalls or 0) + 1
    st.last_error = ARGV[8]
  else
    st.last_error = ARGV[9]
  end
  if outcome == RECOVER.RETURNED and lease.kind ~= 'standing'
      and st.stalls >= tonumber(ARGV[2]) then
    outcome = RECOVER.DEAD_LETTERED
    redis.call('LPUSH', KEYS[7], '{"id":' .. cjson.encode(lease.id) ..
      ',"reason":' .. cjson.encode('lease lost ' .. st.stalls .. ' times; last attempt ' ..
      lease.attempt) .. ',"stalls":' .. st.stalls .. ',"attempts":' .. st.attempts ..
      ',"at":' .. now .. ',"spec":' .. spec .. '}')
    redis.call('HDEL', KEYS[4], lease.id)
    redis.call('HDEL', KEYS[5], lease.id)
  else
    redis.call('HSET', KEYS[5], lease.id, cjson.encode(st))
    if lease.kind == 'action' then
      push_head(KEYS[2], {lease.id})
    elseif lease.kind == 'directive' and not redis.call('SET', KEYS[3], lease.id, 'NX') then
      redis.call('HDEL', KEYS[4], lease.id)
      redis.call('HDEL', KEYS[5], lease.id)
    end
  end
end
local replies = {[RECOVER.RETURNED] = ARGV[5], [RECOVER.DEAD_LETTERED] = ARGV[6],
                 [RECOVER.UNSTARTED] = ARGV[7]}
redis.call('RPUSH', KEYS[8], replies[outcome])
redis.call('EXPIRE', KEYS[8], ARGV[3])
history(KEYS[6], ARGV[4],
  outcome == RECOVER.DEAD_LETTERED and EVENT.DEAD_LETTERED or EVENT.RECOVERED,
  'id', lease.id, 'attempt', lease.attempt, 'started', outcome == RECOVER.UNSTARTED and 'no' or 'yes',
  'request', lease.req)
return {outcome, lease.deadline}
