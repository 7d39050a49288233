-- name: readd
-- A failed attempt puts its target back where it was (stack head, or the directive slot) under the
-- same id, with last_error set, and replies the error to the resolver. One step, so no observer
-- sees the action missing. Fenced by the lease token like finalize.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight   (hash)
--   stack      (zset: the lowest score is the head)
--   directive  is only ever SET NX, which no type refuses. An action (not a slot's target) whose
--                spec went while it was in flight is dead-lettered ("spec missing"): it cannot go
--                back.
--   actions    (hash)
--   state      (hash)
--   hist       history (stream)
--   replies    reply (list)
--   leases     the partition's lease index (zset)
--   dead       (list)
-- ARGV
--   token        lease token
--   last_error   error text
--   reply        JSON
--   reply_ttl_s  reply ttl s
--   maxlen       history maxlen
--   action_id    action id
--   attempt
--   member       index member "<session>/<token>"
-- Returns: 1 when re-added, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
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
