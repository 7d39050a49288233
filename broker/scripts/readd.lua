-- readd: a failed attempt puts its target back where it was (stack head, or the directive slot)
-- under the same id, with last_error set, and replies the error to the resolver. One step, so
-- no observer sees the action missing. Fenced by the lease token like finalize.
-- KEYS[1] inflight (hash)  KEYS[2] stack (zset: the lowest score is the head)
-- KEYS[3] directive (string)
-- KEYS[4] actions (hash)   KEYS[5] state (hash)  KEYS[6] history (stream)  KEYS[7] reply (list)
-- KEYS[8] the partition's lease index (zset)  KEYS[9] dead (list)
-- ARGV[1] lease token  ARGV[2] error text  ARGV[3] reply JSON  ARGV[4] reply ttl s
-- ARGV[5] history maxlen  ARGV[6] action id  ARGV[7] attempt
-- ARGV[8] index member "<session>/<token>"
-- KEYS[3] is only ever SET NX, which no type refuses. An action (not a slot's target) whose
-- spec went while it was in flight is dead-lettered ("spec missing"): it cannot go back.
-- Returns: 1 when re-added, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
local inflight, stack, directive, actions = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local state, hist, replies, leases, dead = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local token, last_error, reply, reply_ttl_s = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local maxlen, action_id, attempt, member = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
redis.replicate_commands()
local lease = json_field('lease', inflight, token)
if not lease then
  history(hist, maxlen, EVENT.LATE_REFUSED, 'id', action_id, 'attempt', attempt,
    'outcome', EVENT.FAILED)
  return 0
end
local kept = call_on('HEXISTS', actions, lease.id) == 1
local st = kept and counters(state, lease.id)  -- POISON before the first write
-- the history entry is the first write; every other key written is checked before it
check_types({[stack] = 'zset', [replies] = 'list', [leases] = 'zset', [dead] = 'list'})
history(hist, maxlen, EVENT.FAILED, 'id', lease.id, 'attempt', lease.attempt,
  'request', lease.req, 'error', last_error, by_of(lease))
end_lease(inflight, leases, token, member)
if not kept and lease.kind == 'action' then
  spec_missing(dead, hist, maxlen, lease.id, now_ms())
elseif kept then
  -- a newer directive set meanwhile wins; the failed one is dropped
  kept = put_back(stack, directive, actions, state, lease.kind, lease.id, true)
end
if kept then
  -- the counters come back from the lease (take keeps them there while in flight)
  st.attempts = lease.attempt
  st.last_error = last_error
  redis.call('HSET', state, lease.id, cjson.encode(st))
end
send_reply(replies, reply, reply_ttl_s)
return 1
