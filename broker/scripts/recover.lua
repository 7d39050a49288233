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
-- recovered already), RETURNED, DEAD_LETTERED (also an action whose spec is missing: it
-- cannot go back), UNSTARTED, or LIVE (nothing done; the deadline says when to look again).
local inflight, stack, directive, actions = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local state, hist, dead, replies, leases = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local token, max_stalls, reply_ttl_s, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local returned_reply, dead_reply, unstarted_reply = ARGV[5], ARGV[6], ARGV[7]
local returned_error, unstarted_error, member = ARGV[8], ARGV[9], ARGV[10]
redis.replicate_commands()
check_types({[inflight] = 'hash', [stack] = 'zset', [directive] = 'string', [actions] = 'hash',
  [state] = 'hash', [hist] = 'stream', [dead] = 'list', [replies] = 'list', [leases] = 'zset'})
local lease = json_field('lease', inflight, token)
if not lease then
  redis.call('ZREM', leases, member)
  return {RECOVER.GONE, 0}
end
local now = now_ms()
if lease.deadline > now then
  redis.call('ZADD', leases, lease.deadline, member)
  return {RECOVER.LIVE, lease.deadline}
end
local spec = redis.call('HGET', actions, lease.id)
local st = spec and counters(state, lease.id)  -- POISON before the first write
end_lease(inflight, leases, token, member)
local outcome = RECOVER.RETURNED
if lease.state == 'dispatched' then
  outcome = RECOVER.UNSTARTED
end
if spec then
  st.attempts = lease.attempt  -- take keeps the counters in the lease while in flight
  if outcome == RECOVER.RETURNED then
    st.stalls = (st.stalls or 0) + 1
    st.last_error = returned_error
  else
    st.last_error = unstarted_error
  end
  if outcome == RECOVER.RETURNED and lease.kind ~= 'standing'
      and st.stalls >= tonumber(max_stalls) then
    outcome = RECOVER.DEAD_LETTERED
    redis.call('LPUSH', dead, '{"id":' .. cjson.encode(lease.id) ..
      ',"reason":' .. cjson.encode('lease lost ' .. st.stalls .. ' times; last attempt ' ..
      lease.attempt) .. ',"stalls":' .. st.stalls .. ',"attempts":' .. st.attempts ..
      ',"at":' .. now .. ',"spec":' .. spec .. '}')
    redis.call('HDEL', actions, lease.id)
    redis.call('HDEL', state, lease.id)
  else
    redis.call('HSET', state, lease.id, cjson.encode(st))
    put_back(stack, directive, actions, state, lease.kind, lease.id, true)
  end
elseif lease.kind == 'action' then
  outcome = RECOVER.DEAD_LETTERED
  spec_missing(dead, nil, nil, lease.id, now)
end
local reply_of = {[RECOVER.RETURNED] = returned_reply, [RECOVER.DEAD_LETTERED] = dead_reply,
                  [RECOVER.UNSTARTED] = unstarted_reply}
send_reply(replies, reply_of[outcome], reply_ttl_s)
history(hist, maxlen,
  outcome == RECOVER.DEAD_LETTERED and EVENT.DEAD_LETTERED or EVENT.RECOVERED,
  'id', lease.id, 'attempt', lease.attempt, 'started', outcome == RECOVER.UNSTARTED and 'no' or 'yes',
  'request', lease.req)
return {outcome, lease.deadline}
