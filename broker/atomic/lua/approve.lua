-- name: approve
-- Record a person's approval of an ask target that take.lua counted and found not the last one
-- needed (TAKE.COUNTED, nothing written there), if the action is still as that take saw it: the
-- same target (directive slot, the stack's first entry, the target's place under it), the same
-- counters, not past its ttl, the approver's grant not revoked, the policy an edit was decided by
-- still in force. Else nothing changes and the caller takes again, which decides on what is there
-- now: so approvals are counted on counters no one changed meanwhile (N distinct people, each
-- once), and only a take ever applies (once: it pops the target).
-- flags: none
-- roles: worker
-- KEYS
--   directive       (string)
--   stack           (zset: the lowest score is the head)
--   actions         (hash)
--   state           (hash)
--   hist            history (stream)
--   marker          request marker (string, dedupes redelivered requests)
--   revoked         the partition's revoked grants (set)
--   expiries        the partition's expiries (zset "<session>/<id>" -> expiry ms)
--   policies        the partition's policy markers (hash: tenant -> version)
--   requests        the partition's request stream (the request is acked here when entry is set)
-- ARGV
--   action_id       the action take counted the approval of
--   req             request id
--   action          "apply"|"discard"
--   approver        the person whose approval this is
--   grant           the id of the serve token it came through ("" for none)
--   patched         with an edit, the composed JSON Merge Patch ("" for none)
--   seen            the counters' text the take read ("" for none)
--   top             the stack's first entry the take read
--   skipped         stale entries above the target the take passed over
--   seen_directive  the directive slot the take read ("" for empty)
--   needed          approvals needed
--   session         (an expiries member is "<session>/<id>")
--   edit_tenant     as take's: "" for no edit
--   edit_version    as take's
--   maxlen          history maxlen
--   marker_ttl_s    marker ttl seconds
--   entry           the request's entry id in requests, acked (XACK + XDEL) when recorded ("" when
--                     the caller acks it)
--   group           the request stream's consumer group
-- Errors: POISON (a key of another type, counters that do not parse): nothing changed
-- Returns: {TAKE.APPROVED, id, spec JSON, counters JSON, "1"} (recorded, with its history
--          entry, and acked)
--          | {TAKE.RETAKE} (the action is not as the take saw it: nothing changed, not acked)
--          | {TAKE.DUP} (the request was served meanwhile: nothing changed, acked)
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
