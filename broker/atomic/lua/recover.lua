-- name: recover
-- An attempt whose lease expired goes back where it was. If a handler was running (its worker died
-- or hung) that is a stall: stalls + 1, and at max_stalls the action is moved to the dead-letter
-- list instead. If no worker ever started it, it just goes back. The resolver waiting on it gets
-- the matching error reply. No-op unless the lease is expired.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight   (hash)
--   stack      (zset: the lowest score is the head)
--   directive  (string)
--   actions    (hash)
--   state      (hash)
--   hist       history (stream)
--   dead       (list)
--   replies    reply (list)
--   leases     the partition's lease index (zset)
-- ARGV
--   token            lease token
--   max_stalls       max stalls
--   reply_ttl_s      reply ttl s
--   maxlen           history maxlen
--   returned_reply   reply JSON when returned after a stall
--   dead_reply       reply JSON when dead-lettered
--   unstarted_reply  reply JSON when no worker started it
--   returned_error   last_error when returned after a stall
--   unstarted_error  last_error when no worker started it
--   member           index member "<session>/<token>"
-- Returns: {outcome, deadline ms}, outcome one of RECOVER: GONE (no such lease: finished or
-- recovered already), RETURNED, DEAD_LETTERED (also an action whose spec is missing: it
-- cannot go back), UNSTARTED, or LIVE (nothing done; the deadline says when to look again).
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
  'id', lease.id, 'attempt', lease.attempt,
  'started', outcome == RECOVER.UNSTARTED and 'no' or 'yes',
  'request', lease.req)
return {outcome, lease.deadline}
