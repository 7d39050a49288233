-- name: take
-- Pick the resolve target atomically (directive, else stack head, else standing handler), lease it
-- to one attempt, index the lease and enqueue its task to a pool of workers that has the handler it
-- needs. The target leaves the stack/slot but its spec stays in the actions hash, so it is never
-- missing: it is either stacked or in flight.
-- An ask target (its spec's policy, read from the JSON text ahead of the payload) is applied, and
-- discarded when that runs a reject handler, only with an approver, once its policy's approvals are
-- given by distinct approvers (the counters' approved_by, of one verb at a time: approving, nil for
-- apply; an approval of the other verb, or with a patch, starts them again at its approver).
-- Approvals given through a serve token revoked since (its grant in the revoked set) no longer
-- count. The last approval takes it as any apply or discard; the approvals are spent (the lease and
-- the taken entry name them). One that is not the last is only counted here (count_approval), and
-- recorded by approve.lua, which the caller runs next. An action's counters stay in the state hash
-- only between attempts: take copies them into the lease (attempt, and whether the hash has an
-- entry: "counted"), and readd/recover write them back; a directive's and a standing handler's are
-- written here as before. A request seen before (redelivered, or retried after a lost reply) takes
-- nothing new: it gets its earlier answer back while that is still actionable (the same lease if no
-- worker has started it, whose task is enqueued again; NONE again), else DUP. A stacked action past
-- its ttl is gone for take as for every reader: passed over, and ended here (history "expired")
-- when it lay above the target. So is a stacked id whose spec is missing, dead-lettered here
-- ("spec missing", history "dead-lettered").
-- flags: none
-- roles: worker
-- KEYS
--   directive     (string)
--   stack         (zset: the lowest score is the head)
--   standing      (string)
--   actions       (hash)
--   state         (hash)
--   inflight      (hash)
--   hist          history (stream)
--   marker        request marker (string, dedupes redelivered requests)
--   replies       reply (list)
--   leases        the partition's lease index (zset)
--   expiries      the partition's expiries (zset "<session>/<id>" -> expiry ms)
--   expired       (zset)
--   requests      the partition's request stream (the request is acked here when entry is set)
--   dead          (list): a stacked id whose spec is missing is dead-lettered there
--   revoked       the partition's revoked grants (set: ids of serve tokens revoked since)
--   sessions      the partition's sessions (hash: session -> tenant), read with tenant
--   policies      the partition's policy markers (hash: tenant -> version), read with edit_tenant
--   ...streams    the partition's task stream of each live pool, in routes_json's order (none when
--                   message is empty: the caller enqueues on a broker of its own)
-- ARGV
--   req             request id
--   action          "apply"|"discard"
--   token           lease token
--   dispatch_ms     dispatch timeout ms (the lease until a worker starts the attempt)
--   marker_ttl_s    marker ttl seconds
--   maxlen          history maxlen
--   reason
--   extra           as a JSON string (kept opaque: cjson would rewrite {} as [])
--   none_reply      reply JSON for "nothing to target"
--   reply_ttl_s     reply ttl seconds
--   session         (the lease index member is "<session>/<token>", an expiries one
--                     "<session>/<id>")
--   routes_json     routes: JSON handler name -> list of pool numbers (1-based)
--   pool_count      number of live pools
--   message         the task message (dramatiq, encoded; carries the lease token) or ""
--   expect_id       ("" for none): take only if this id is the target, else change nothing
--   by              who resolves ("" for unsaid), kept in the lease and the history
--   conflict_reply  reply JSON for "expect_id is not the target"
--   expired_reply   reply JSON for "expect_id expired"
--   memory_ms       expired memory ms
--   entry           the request's entry id in requests, acked (XACK + XDEL) with whatever this
--                     script answers but NO_WORKER; "" when the caller acks it (after sending the
--                     task itself)
--   group           the request stream's consumer group
--   trace           the take's trace context ("" for none), kept opaque in the lease
--                     (broker/tracing.py)
--   approver        the person whose resolve this is ("" for none: the model's)
--   revision        the target's revision the caller saw ("" for unsaid): another one changes
--                     nothing (REVISED)
--   patched         with an approval that edits, the composed JSON Merge Patch of the original
--                     payload to the edited one, as JSON text ("" for none)
--   grant           the id of the serve token the approver's resolve came through ("" for none: an
--                     approval given some other way, which no revocation voids)
--   tenant          whose resolve this is ("" for unsaid): in a session another tenant owns it
--                     finds nothing, and answers as in a session that does not exist
--   edit_tenant     edit tenant: with an edit, the tenant whose policy decided it ("" for no edit)
--   edit_version    edit version: the version of that policy it was decided by ("" for none):
--                     another in force now changes nothing (REDECIDE)
-- Errors: POISON (a key of another type, a lease or counters that do not parse): nothing changed
-- Returns: {TAKE.OK, id, kind, attempt, deadline ms, token, pool number}
--          | {TAKE.NONE} (replied here) | {TAKE.CONFLICT} (replied here) | {TAKE.DUP}
--          | {TAKE.NO_WORKER, id, handler name or "", spec JSON} (no live pool has it:
--            nothing changed)
--          | {TAKE.NEEDS_APPROVAL, id, spec JSON, counters JSON} (an apply of an ask target,
--            or a discard of one with a reject handler, with no approver or one whose token
--            was revoked: nothing changed, not acked)
--          | {TAKE.REVISED, id, spec JSON, counters JSON} (revision is not the target's:
--            nothing changed, not acked)
--          | {TAKE.REDECIDE, id, spec JSON, counters JSON} (the edit was decided by another
--            version of the policy than the one in force: nothing changed, not acked)
--          | {TAKE.APPROVED, id, spec JSON, counters JSON, "0"} (an approval of an ask target
--            that needs more, whose approver had approved already: nothing changed, not acked)
--          | {TAKE.COUNTED, id, spec JSON, counters JSON, the counters as read or "", the
--            stack's first entry or "", stale entries above the target, the directive slot or
--            "", approvals needed} (an approval of an ask target that needs more: counted,
--            nothing changed, not acked; approve.lua records it)
redis.replicate_commands()
local now = now_ms()
local routes = cjson.decode(routes_json)
local npools = tonumber(pool_count)

-- a spec's JSON text before its first free-form field: the payload, or where a spec has
-- none (an empty one is not stored), created_at, which every spec has and which follows
-- (broker/models.py Spec). Nothing ahead of it holds an unescaped quote of its own, so its
-- first such key is the spec's own: a payload key "reject" or a schema's "policy" is not
-- read as the spec's
local function head(spec)
  local stop = string.find(spec, '"payload":', 1, true)
    or string.find(spec, '"created_at":', 1, true)
  return stop and string.sub(spec, 1, stop - 1) or spec
end

-- the handler the target needs for this action, read from the spec's head without decoding
-- its payload: "apply" and "reject" are there, and a quote inside a string value is escaped
local function needs(spec)
  local field = action == 'apply' and 'apply' or 'reject'
  return string.match(head(spec), '"' .. field .. '":"([^"]*)"')
end

-- the end of a taken entry: who approved (the last approval's take), and who resolves
local function approvals_of(names, who)
  if names then
    if who ~= '' then return 'approved_by', names, 'by', who end
    return 'approved_by', names
  end
  return by_of({by = who})
end

-- the pool number for the target, or nil: one of the pools that have its handler, spread by the
-- token (random hex)
local function route(spec)
  local name = needs(spec)
  local pools
  if name then
    pools = routes[name]
  elseif npools > 0 then
    return 1 + tonumber(string.sub(token, 1, 6), 16) % npools, nil
  end
  if not pools or #pools == 0 then return nil, name or '' end
  return pools[1 + tonumber(string.sub(token, 1, 6), 16) % #pools], name
end

-- the task stream of pool number ``pool``
local function stream(pool)
  return KEYS[streams_at + pool - 1]
end

local function enqueue(pool, lease_token)
  if message ~= '' then
    local task = message
    if lease_token ~= token then task = string.gsub(task, token, lease_token) end
    add_task(stream(pool), task)
  end
end

-- every key the chosen path writes, but its first, is checked before that first write (the
-- keys it reads are checked by reading them); the request stream when this script acks
local function check(expected)
  if entry ~= '' then expected[requests] = 'stream' end
  check_types(expected)
end

local function ack()
  ack_request(requests, group, entry)
end

local prev = call_on('GET', marker)
if prev == 'none' or prev == 'conflict' then
  check({})
  ack()
  return {prev == 'none' and TAKE.NONE or TAKE.CONFLICT}
elseif prev then
  local lease = json_field('lease', inflight, prev)
  -- taken before any ttl passed: its spec is all it needs to be dispatched again
  local spec = lease and call_on('HGET', actions, lease.id)
  if lease and lease.state == 'dispatched' and spec then
    local pool = route(spec)
    if pool then
      check(message ~= '' and {[stream(pool)] = 'stream'} or {})
      enqueue(pool, prev)
      ack()
      return {TAKE.OK, lease.id, lease.kind, tostring(lease.attempt),
              tostring(lease.deadline), prev, pool}
    end
  end
  check({})
  ack()
  return {TAKE.DUP}
end

-- whether a spec may have a ttl, read from its JSON text: a spec written with expires_at ahead
-- of the payload (broker/models.py Spec) says so itself; any other (an older one) may. Plain
-- finds: a pattern match that fails (a spec without the field) tries every position of the
-- spec, ~5 us for a 256 B payload, ten times a plain find
local function may_expire(spec)
  local at = string.find(spec, '"expires_at":', 1, true)
  if not at then return false end
  local payload = string.find(spec, '"payload":', 1, true)
  return string.sub(spec, at + 13, at + 16) ~= 'null' or (payload ~= nil and at > payload)
end

-- an action's policy decision {decision, approvals, rule, ...}, read from its spec's JSON
-- text: a spec writes policy (flat: no object inside) ahead of the payload (broker/models.py
-- Spec); nil for none
local function policy_of(spec)
  local before = head(spec)
  local at = string.find(before, '"policy":{', 1, true)
  if not at then return nil end
  local ok, found = pcall(cjson.decode, string.match(before, '%b{}', at + 9) or '')
  return ok and type(found) == 'table' and found or nil
end

-- the spec of an id that is still there to take: not gone, not past a ttl
local function live_spec(id)
  if not id then return nil end
  local spec = call_on('HGET', actions, id)
  if spec and not (may_expire(spec) and past_ttl(expiries, session .. '/' .. id, now)) then
    return spec
  end
  return nil
end

-- the target, read before anything changes (scripts check before they write): its id, its
-- kind, its spec, whether a stale directive is in the slot, and how many stale stack entries
-- lie above it
local function target()
  local id = call_on('GET', directive)
  local stale_directive = id ~= false
  local spec = live_spec(id)
  if spec then return id, 'directive', spec, false, 0 end
  local i = 0
  while true do
    id = call_on('ZRANGE', stack, i, i)[1]
    if not id then break end
    spec = live_spec(id)
    if spec then return id, 'action', spec, stale_directive, i end
    i = i + 1
  end
  id = call_on('GET', standing)
  spec = live_spec(id)
  if spec then return id, 'standing', spec, stale_directive, i end
  return nil, nil, nil, stale_directive, i
end

local id, kind, spec, stale_directive, skipped = target()
-- a tenant's resolve in a session another tenant owns finds nothing there, in the step that
-- takes (a stage by that tenant just before is never taken), and touches none of it
if tenant ~= '' and (id or stale_directive or skipped > 0) then
  local owner = call_on('HGET', sessions, session)
  if owner and owner ~= '' and owner ~= tenant then
    id, kind, spec, stale_directive, skipped = nil, nil, nil, false, 0
  end
end
if expect_id ~= '' and id ~= expect_id then
  local gone = call_on('ZSCORE', expired, expect_id)
    or past_ttl(expiries, session .. '/' .. expect_id, now)
  check({})
  send_reply(replies, gone and expired_reply or conflict_reply, reply_ttl_s)
  redis.call('SET', marker, 'conflict', 'EX', marker_ttl_s)
  ack()
  return {TAKE.CONFLICT}
end
local st, counted
if id then
  st, counted = counters(state, id)  -- POISON here changes nothing
  -- an edit goes only with the policy it was decided by: one that changed since may decide
  -- the edited payload otherwise (as stage.lua refuses a stage decided by another version)
  if edit_tenant ~= '' and (call_on('HGET', policies, edit_tenant) or '') ~= edit_version then
    return {TAKE.REDECIDE, id, spec, cjson.encode(st)}
  end
end
-- people's approvals of an ask target (read and decided before anything is written): an
-- apply, or a discard that runs a reject handler (the policy decided that handler too)
local approved_by
if id and kind == 'action' then
  if revision ~= '' and tonumber(revision) ~= (st.revision or 0) then
    return {TAKE.REVISED, id, spec, cjson.encode(st)}
  end
  local policy = (action == 'apply' or needs(spec)) and policy_of(spec)
  if policy and policy.decision == 'ask' then
    drop_revoked(st, revoked)
    if approver == '' or (grant ~= '' and call_on('SISMEMBER', revoked, grant) == 1) then
      return {TAKE.NEEDS_APPROVAL, id, spec, cjson.encode(st)}
    end
    local needed = tonumber(policy.approvals) or 1
    local count, given = count_approval(st, approver, grant, action, patched)
    if count < needed then
      if given then
        return {TAKE.APPROVED, id, spec, cjson.encode(st), '0'}
      end
      -- not the last one: nothing written here, so that this script only ever takes. What
      -- approve.lua re-checks before it records it: the counters as read, the stack's first
      -- entry, how many stale entries lie above the target, the directive slot
      return {TAKE.COUNTED, id, spec, cjson.encode(st), counted or '',
              call_on('ZRANGE', stack, 0, 0)[1] or '', skipped,
              call_on('GET', directive) or '', needed}
    end
    -- the last one: spent by the attempt it starts, which names them
    approved_by = table.concat(st.approved_by, ',')
    st.approved_by, st.grants, st.approving = nil, nil, nil
  end
end
local pool, name
if id then
  pool, name = route(spec)
  if not pool then
    return {TAKE.NO_WORKER, id, name, spec}  -- nothing changed
  end
end

-- what this path writes after its first write (each path below starts with a call_on write)
local expected = {}
if skipped > 0 then  -- entries above the target end here: their history, the memory
  expected[state], expected[hist], expected[expired], expected[dead] = 'hash', 'stream', 'zset',
    'list'
end
if not id then
  check(expected)
  send_reply(replies, none_reply, reply_ttl_s)
else
  expected[inflight], expected[leases] = 'hash', 'zset'
  if approved_by then expected[state] = 'hash' end
  if message ~= '' then expected[stream(pool)] = 'stream' end
  check(expected)
  st.attempts = (st.attempts or 0) + 1
  if skipped == 0 then  -- else after the expired entries, in the order things happened
    history(hist, maxlen, EVENT.TAKEN, 'id', id, 'kind', kind, 'action', action,
      'attempt', st.attempts, 'request', req, approvals_of(approved_by, by))
  end
end
if stale_directive or kind == 'directive' then
  redis.call('DEL', directive)
end
if skipped > 0 then
  local popped = redis.call('ZPOPMIN', stack, skipped)  -- id, score, id, score, ...
  for j = 1, #popped, 2 do
    local x = popped[j]
    if redis.call('HEXISTS', actions, x) == 1 then
      end_expired(actions, state, expiries, session .. '/' .. x, expired, hist, maxlen,
        memory_ms, x, now)
    else
      spec_missing(dead, hist, maxlen, x, now)
    end
  end
end
if kind == 'action' then
  redis.call('ZPOPMIN', stack)
end
if not id then
  redis.call('SET', marker, 'none', 'EX', marker_ttl_s)
  ack()
  return {TAKE.NONE}
end
if skipped > 0 then
  history(hist, maxlen, EVENT.TAKEN, 'id', id, 'kind', kind, 'action', action,
    'attempt', st.attempts, 'request', req, approvals_of(approved_by, by))
end
redis.call('SET', marker, token, 'EX', marker_ttl_s)
if kind ~= 'action' or approved_by then
  -- an action's counters stay in its lease while in flight; its approvals, spent now, go
  redis.call('HSET', state, id, cjson.encode(st))
end
local deadline = now + tonumber(dispatch_ms)
local lease = cjson.encode({
  id = id, kind = kind, token = token, attempt = st.attempts, req = req,
  action = action, deadline = deadline, state = 'dispatched', reason = reason, extra = extra,
  by = by, counted = counted ~= nil or kind ~= 'action' or approved_by ~= nil,
  approved_by = approved_by, trace = trace ~= '' and trace or nil})
redis.call('HSET', inflight, token, lease)
redis.call('ZADD', leases, deadline, session .. '/' .. token)
ack()
enqueue(pool, token)
return {TAKE.OK, id, kind, tostring(st.attempts), tostring(deadline), token, pool}
