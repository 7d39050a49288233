-- name: finalize
-- Record an outcome that consumes its target (applied, discarded, stale, or a failed directive) and
-- reply to the resolver. Fenced: a token whose lease is gone (recovered, or a duplicate) changes
-- nothing.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight  (hash)
--   actions   (hash)
--   state     (hash)
--   hist      history
--   replies   reply (list)
--   leases    the partition's lease index (zset)
-- ARGV
--   token           lease token
--   reply           JSON
--   reply_ttl_s     reply ttl s
--   maxlen          history maxlen
--   event           (EVENT.APPLIED | EVENT.DISCARDED | EVENT.STALE | EVENT.FAILED for a directive)
--   action_id       action id
--   attempt
--   member          index member "<session>/<token>"
--   ...noted        more field, value pairs for the history entry
-- Returns: 1 when recorded, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
local lease = json_field('lease', inflight, token)
if not lease then
  history(hist, maxlen, EVENT.LATE_REFUSED, 'id', action_id, 'attempt', attempt,
    'outcome', event)
  return 0
end
local consumed = lease.kind ~= 'standing'
-- the history entry is the first write; every other key written is checked before it. An
-- action's counters are in the state hash only if it had gone back before (take: counted)
local expected = {[replies] = 'list', [leases] = 'zset'}
if consumed then
  expected[actions] = 'hash'
  if lease.counted ~= false then expected[state] = 'hash' end
end
check_types(expected)
local fields = {'id', lease.id, 'attempt', lease.attempt, 'request', lease.req}
for i = noted_at, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
if lease.by and lease.by ~= '' then
  fields[#fields + 1] = 'by'
  fields[#fields + 1] = lease.by
end
history(hist, maxlen, event, unpack(fields))
end_lease(inflight, leases, token, member)
if consumed then
  redis.call('HDEL', actions, lease.id)
  if lease.counted ~= false then redis.call('HDEL', state, lease.id) end
end
send_reply(replies, reply, reply_ttl_s)
return 1
