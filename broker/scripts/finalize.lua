-- finalize: record an outcome that consumes its target (applied, discarded, stale, or a failed
-- directive) and reply to the resolver. Fenced: a token whose lease is gone (recovered, or a
-- duplicate) changes nothing.
-- KEYS[1] inflight (hash)  KEYS[2] actions (hash)  KEYS[3] state (hash)  KEYS[4] history
-- KEYS[5] reply (list)    KEYS[6] the partition's lease index (zset)
-- ARGV[1] lease token  ARGV[2] reply JSON  ARGV[3] reply ttl s  ARGV[4] history maxlen
-- ARGV[5] event (EVENT.APPLIED | EVENT.DISCARDED | EVENT.STALE | EVENT.FAILED for a directive)
-- ARGV[6] action id  ARGV[7] attempt  ARGV[8] index member "<session>/<token>"
-- ARGV[9...] more field, value pairs for the history entry
-- Returns: 1 when recorded, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
local inflight, actions, state, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local replies, leases = KEYS[5], KEYS[6]
local token, reply, reply_ttl_s, maxlen = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local event, action_id, attempt, member = ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local noted_at = 9
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
