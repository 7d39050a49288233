-- approve: record a person's approval of an ask target that take.lua counted and found not the
-- last one needed (TAKE.COUNTED, nothing written there), if the action is still as that take
-- saw it: the same target (directive slot, the stack's first entry, the target's place under
-- it), the same counters, not past its ttl, the approver's grant not revoked, the policy an
-- edit was decided by still in force. Else nothing changes and the caller takes again, which
-- decides on what is there now: so approvals are counted on counters no one changed meanwhile
-- (N distinct people, each once), and only a take ever applies (once: it pops the target).
-- KEYS[1] directive (string)  KEYS[2] stack (zset: the lowest score is the head)
-- KEYS[3] actions (hash)  KEYS[4] state (hash)  KEYS[5] history (stream)
-- KEYS[6] request marker (string, dedupes redelivered requests)
-- KEYS[7] the partition's revoked grants (set)  KEYS[8] the partition's expiries (zset)
-- KEYS[9] the partition's policy markers (hash: tenant -> version)
-- KEYS[10] the partition's request stream (the request is acked here when ARGV[17] is set)
-- ARGV[1] action id  ARGV[2] request id  ARGV[3] "apply"|"discard"  ARGV[4] approver
-- ARGV[5] grant ("" for none)  ARGV[6] patched ("" for none)
-- ARGV[7] the counters' text the take read ("" for none)
-- ARGV[8] the stack's first entry the take read  ARGV[9] stale entries above the target
-- ARGV[10] the directive slot the take read ("" for empty)  ARGV[11] approvals needed
-- ARGV[12] session (an expiries member is "<session>/<id>")
-- ARGV[13] edit tenant  ARGV[14] edit version (as take's: "" for no edit)
-- ARGV[15] history maxlen  ARGV[16] marker ttl seconds
-- ARGV[17] the request's entry id in KEYS[10], acked (XACK + XDEL) when recorded ("" when the
--          caller acks it)  ARGV[18] the request stream's consumer group
-- Errors: POISON (a key of another type, counters that do not parse): nothing changed
-- Returns: {TAKE.APPROVED, id, spec JSON, counters JSON, "1"} (recorded, with its history
--          entry, and acked)
--          | {TAKE.RETAKE} (the action is not as the take saw it: nothing changed, not acked)
--          | {TAKE.DUP} (the request was served meanwhile: nothing changed, acked)
local directive, stack, actions, state, hist = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local marker, revoked, expiries, policies, requests = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local action_id, req, action, approver, grant = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local patched, seen, top, skipped, seen_directive = ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local needed, session, edit_tenant, edit_version = ARGV[11], ARGV[12], ARGV[13], ARGV[14]
local maxlen, marker_ttl_s, entry, group = ARGV[15], ARGV[16], ARGV[17], ARGV[18]
redis.replicate_commands()
-- every key written after the first write (the state hash's HSET, through call_on)
check_types({[hist] = 'stream', [requests] = entry ~= '' and 'stream' or nil})
if call_on('GET', marker) then
  ack_request(requests, group, entry)
  return {TAKE.DUP}
end
-- the same target: a push on the stack changes its first entry, a removal above the target
-- its place (the stale entries above it stay stale), a directive set meanwhile the slot. (The
-- session's owner, which take checked, never changes while it holds an action.)
local same = (call_on('GET', directive) or '') == seen_directive
  and (call_on('ZRANGE', stack, 0, 0)[1] or '') == top
  and call_on('ZRANK', stack, action_id) == tonumber(skipped)
local spec = same and call_on('HGET', actions, action_id)
if not spec then
  return {TAKE.RETAKE}
end
local st, raw = counters(state, action_id)
if (raw or '') ~= seen or past_ttl(expiries, session .. '/' .. action_id, now_ms())
    or (grant ~= '' and call_on('SISMEMBER', revoked, grant) == 1)
    or (edit_tenant ~= '' and (call_on('HGET', policies, edit_tenant) or '') ~= edit_version) then
  return {TAKE.RETAKE}
end
-- counted again as take counted it: the same counters give the same count, or fewer if a
-- grant was revoked since (never more, and never one given already)
drop_revoked(st, revoked)
local count = count_approval(st, approver, grant, action, patched)
call_on('HSET', state, action_id, cjson.encode(st))
local edit = patched ~= '' and {'edit', patched} or {}
history(hist, maxlen, EVENT.APPROVED, 'id', action_id, 'by', approver, 'approvals',
  count .. '/' .. needed, 'revision', st.revision or 0, 'request', req, unpack(edit))
redis.call('SET', marker, 'approved', 'EX', marker_ttl_s)
ack_request(requests, group, entry)
return {TAKE.APPROVED, action_id, spec, cjson.encode(st), '1'}
