-- name: stage
-- Push new pending actions of one session on the head of its stack, in the order given (the last
-- one given ends up the head), each with its `staged` entry in the session's history (naming a
-- tenant other than the default) and in its partition's event feed. Their counters (state hash) are
-- written at their first take: an action that has none is at attempt 0, no stalls, which saves a
-- field, and for a session's first action a whole key, per pending action. The session's first
-- stage claims it for its tenant, in this step: its field in its partition's sessions hash (the
-- owner record) and, for a tenant that keeps one, its member in the tenant's index of the
-- partition. Refused with nothing changed: a session of another tenant; a session with no owner
-- record but keys of its own (its record was lost: another tenant must not take it over, an
-- operator restores it); an id that holds another spec (its counter was set back: the new action
-- would replace or vanish behind an old one); actions decided by another version of the tenant's
-- policy than this partition's marker names. What a policy decided for each action is carried out
-- here (docs/design.md, Policies): allow and ask stage as usual; deny stages nothing, records
-- `denied` (history and feed) and a denial marker; auto stores the spec on no stack, leases it
-- (dispatched, attempt 1, by policy:<rule>), marks its request as taken and adds that request to
-- the partition's request stream, whose take enqueues the task for the lease (a redelivered
-- request's path).
-- flags: none
-- roles: producer, serve
-- KEYS
--   stack            (zset: the lowest score is the head)
--   actions          (hash)
--   hist             history (stream)
--   sessions         the partition's sessions (hash: session -> tenant)
--   tenants          the tenant's index in the partition (set of sessions; written only when
--                      indexed)
--   expiries         the partition's expiries (zset "<session>/<id>" -> expiry ms: the one record
--                      of a ttl, read by every reader and by the sweep)
--   expiries_due     the expiries' mark (string, ms: none is due before it), lowered to a new
--                      expiry
--   feed             the partition's event feed (stream)
--   policies         the partition's policy markers (hash: tenant -> version)
--   inflight         (hash)
--   leases           the partition's lease index (zset)
--   requests         the partition's request stream
--   ...markers       one per action decided auto or deny, in the order given: its request's marker
--                      (auto) or its denial marker (deny)
-- ARGV
--   maxlen             history maxlen
--   tenant
--   session            (the expiries member is "<session>/<id>")
--   indexed            "1" when the tenant keeps an index, else ""
--   feed_maxlen        the feed's maxlen
--   at                 the feed entries' time (s)
--   policy_version     the policy version the actions were decided by ("" for none)
--   dispatch_ms        dispatch timeout ms (an auto lease's)
--   marker_ttl_s       an auto request's marker ttl s
--   denial_ttl_s       a denial marker's ttl s
--   max_pending        the most pending actions the session may hold (MAX_PENDING_PER_SESSION)
--   ...actions         seven per action: its id ("pending-action:<tool>:<seq>"), its spec JSON, its
--                        ttl in ms or "" for none (the expiry is reckoned on the server's clock, so
--                        a client's clock can be off without moving it), its created_at (s) for the
--                        feed, its decision ("" without a policy, allow, ask, deny, auto), the
--                        deciding rule ("" for the default), and: deny, the reason; ask, the
--                        approvals needed; auto, the lease token (32 hex digits) then the request's
--                        JSON; else ""
-- Errors: POISON (a key of another type): nothing changed
-- Returns: one number per action: the stack depth right after its push (1 for deny and auto,
-- pushed on no stack), or 0 when its id holds this very spec already (a retried call whose
-- first try went through; nothing changed for it). Refused, nothing changed at all:
-- {STAGE.FOREIGN} (another tenant's session), {STAGE.UNOWNED} (no owner record, keys of its
-- own), {STAGE.COLLISION, id} (that id holds another spec), {STAGE.POLICY, version} (the
-- partition's version of the tenant's policy, "" for none), {STAGE.FULL, depth} (the session
-- holds depth actions, stacked or in flight, and these would take it past max_pending).
-- one record per action from ARGV[actions_at] on, its fields in the order of ToStage's
-- (broker/atomic/scripts.py; tests/test_scripts.py compares the two)
local RECORD = {'id', 'spec', 'ttl_ms', 'created', 'decision', 'rule', 'more'}
local WIDTH = #RECORD
local act = {}  -- an action's index in ARGV -> its record, by field name
for i = actions_at, #ARGV, WIDTH do
  local a = {}
  for n, name in ipairs(RECORD) do a[name] = ARGV[i + n - 1] end
  act[i] = a
end
redis.replicate_commands()

local owner = call_on('HGET', sessions, session)
if owner and owner ~= '' and owner ~= tenant then
  return {STAGE.FOREIGN}
end
local current = call_on('HGET', policies, tenant) or ''
if current ~= policy_version then
  return {STAGE.POLICY, current}
end
local claim = owner ~= tenant
local ttl, auto = false, false
local marker_of, m = {}, markers_at  -- an action's index in ARGV -> its marker key
for i = actions_at, #ARGV, WIDTH do
  ttl = ttl or act[i].ttl_ms ~= ''
  local decision = act[i].decision
  if decision == 'auto' or decision == 'deny' then
    marker_of[i], m = KEYS[m], m + 1
  end
  if decision == 'auto' then  -- read before any write: a request that does not parse
    auto = auto or {}        -- changes nothing
    local ok, r = pcall(cjson.decode, string.sub(act[i].more, 33))
    if not ok or type(r) ~= 'table' or type(r.req) ~= 'string' or type(r.reason) ~= 'string' then
      return redis.error_reply('ERR stage: the auto request of ' .. act[i].id .. ' does not parse')
    end
    auto[i] = r
  end
end
-- the keys written after the first write (the feed's; the actions hash checks its own type)
local types = {[stack] = 'zset', [hist] = 'stream'}
if ttl then types[expiries] = 'zset' end
if claim and indexed ~= '' then types[tenants] = 'set' end
if auto then types[inflight], types[leases], types[requests] = 'hash', 'zset', 'stream' end
check_types(types)
-- one HMGET and one HSET for the lot, not an HSETNX each: a command costs Redis far more to
-- call from a script, and to write to the AOF, than its arguments do
local ids = {}
for i = actions_at, #ARGV, WIDTH do ids[#ids + 1] = act[i].id end
local there = call_on('HMGET', actions, unpack(ids))
if not owner and redis.call('EXISTS', stack, actions, hist) > 0 then
  return {STAGE.UNOWNED}
end
local out, new, fields, fresh = {}, {}, {}, {}
for k, id in ipairs(ids) do
  local at_k = actions_at + WIDTH * (k - 1)  -- the id's index in ARGV
  local spec, decision = act[at_k].spec, act[at_k].decision
  local held = there[k] or fresh[id]
  if decision == 'deny' then
    held = held or call_on('GET', marker_of[at_k])
  elseif decision == 'auto' and not held and call_on('GET', marker_of[at_k]) then
    held = spec  -- its request was taken and the action is done: sent again, it is a no-op
  end
  if held then
    if held ~= spec then return {STAGE.COLLISION, id} end
    out[k] = 0
  else
    fresh[id] = spec
    new[#new + 1] = at_k
    if decision ~= 'deny' then
      fields[#fields + 1] = id
      fields[#fields + 1] = spec
    end
    out[k] = 1
  end
end
if #new == 0 then
  return out
end
-- a session holds at most max_pending actions, stacked or in flight (a model's loop of stages
-- must not grow it without end): an auto action counts, as it comes back to the stack should
-- its handler fail; an action that comes back is never refused, and never takes it past this
local adding = 0
for _, i in ipairs(new) do
  if act[i].decision ~= 'deny' then adding = adding + 1 end
end
if adding > 0 then
  local depth = redis.call('ZCARD', stack) + call_on('HLEN', inflight)
  if depth + adding > tonumber(max_pending) then return {STAGE.FULL, tostring(depth)} end
end
-- ``base`` with what the policy decided for the action act[i] (for the history and the
-- feed) and ``more`` appended: the fields of one entry
local function with_decision(base, i, more)
  local decision, rule = act[i].decision, act[i].rule
  if decision ~= '' then
    for _, x in ipairs({'decision', decision == 'auto' and 'allow' or decision, 'rule', rule,
                        'policy', policy_version}) do
      base[#base + 1] = x
    end
    if decision == 'ask' then
      base[#base + 1] = 'approvals'
      base[#base + 1] = act[i].more
    elseif decision == 'auto' then
      base[#base + 1] = 'auto'
      base[#base + 1] = 'true'
    end
  end
  for _, x in ipairs(more or {}) do base[#base + 1] = x end
  return base
end
-- the feed's entries first: the first write checks its own key's type (POISON, nothing
-- written), which saves a TYPE call on every stage
for _, i in ipairs(new) do
  local tool = string.match(act[i].id, '^pending%-action:(.+):%d+$') or ''
  if act[i].decision == 'deny' then
    append(feed, EVENT.DENIED, 'at', at, 'session', session, 'tenant', tenant, 'id', act[i].id,
      'tool', tool, 'kind', 'action', 'created_at', act[i].created, 'rule', act[i].rule,
      'reason', act[i].more, 'policy', policy_version)
  else
    local fields = {'at', at, 'session', session, 'tenant', tenant, 'id', act[i].id, 'tool',
      tool, 'kind', 'action', 'created_at', act[i].created}
    -- a plain allow is the feed's default: only what waits for people or is applied at once
    -- says so (webhooks, metrics); the history names every decision
    if act[i].decision ~= 'allow' then fields = with_decision(fields, i) end
    append(feed, EVENT.STAGED, unpack(fields))
  end
end
trim(feed, feed_maxlen)
if #fields > 0 then redis.call('HSET', actions, unpack(fields)) end
if claim then
  redis.call('HSET', sessions, session, tenant)
  if indexed ~= '' then redis.call('SADD', tenants, session) end
end
-- live again: what retire.lua set to expire stays (PERSIST is a no-op on a key without a ttl)
redis.call('PERSIST', hist)
local pushed, pushed_at = {}, {}
for _, i in ipairs(new) do
  local decision = act[i].decision
  if decision ~= 'deny' and decision ~= 'auto' then
    pushed[#pushed + 1] = act[i].id
    pushed_at[i] = #pushed
  end
end
local depth = #pushed > 0 and push_head(stack, pushed) or 0
-- a tenant other than the default is named in each staged entry of the history: what the
-- session's owner record is restored from, should it be lost (`pending-actions repair`)
local owned = indexed ~= '' and {'tenant', tenant} or {}
local now = (ttl or auto) and now_ms()
local soonest
for _, i in ipairs(new) do
  local id, decision = act[i].id, act[i].decision
  if pushed_at[i] then out[(i - actions_at) / WIDTH + 1] = depth + pushed_at[i] end
  if decision == 'deny' then
    redis.call('SET', marker_of[i], act[i].spec, 'EX', denial_ttl_s)
    append(hist, EVENT.DENIED, 'id', id, 'rule', act[i].rule, 'reason', act[i].more,
      'policy', policy_version, unpack(owned))
  else
    local base = {'id', id}
    if act[i].ttl_ms ~= '' then
      local due = now + tonumber(act[i].ttl_ms)
      redis.call('ZADD', expiries, due, session .. '/' .. id)
      base = {'id', id, 'expires_at', due}
      soonest = math.min(soonest or due, due)
    end
    append(hist, EVENT.STAGED, unpack(with_decision(base, i, owned)))
  end
  if decision == 'auto' then
    local token, request = string.sub(act[i].more, 1, 32), string.sub(act[i].more, 33)
    local r = auto[i]
    local by = 'policy:' .. act[i].rule
    local deadline = now + tonumber(dispatch_ms)
    redis.call('HSET', inflight, token, cjson.encode({
      id = id, kind = 'action', token = token, attempt = 1, req = r.req, action = 'apply',
      deadline = deadline, state = 'dispatched', reason = r.reason, extra = 'null', by = by,
      counted = false, trace = type(r.trace) == 'string' and r.trace or nil}))
    redis.call('ZADD', leases, deadline, session .. '/' .. token)
    redis.call('SET', marker_of[i], token, 'EX', marker_ttl_s)
    add_request(requests, request)
    append(hist, EVENT.TAKEN, 'id', id, 'kind', 'action', 'action', 'apply', 'attempt', 1,
      'request', r.req, 'by', by)
  end
end
trim(hist, maxlen)
if soonest then
  -- the mark is a hint that only lowers: one absent, unreadable or of another type is left
  -- as it is, and the sweep, which then reads the index, sets it again
  local mark = redis.pcall('GET', expiries_due)
  if type(mark) == 'string' and tonumber(mark) and tonumber(mark) > soonest then
    redis.call('SET', expiries_due, string.format('%d', soonest))  -- digits, never 1.7e+12
  end
end
return out
