-- stage: push new pending actions of one session on the head of its stack, in the order given
-- (the last one given ends up the head), each with its `staged` entry in the session's history
-- (naming a tenant other than the default) and in its partition's event feed. Their counters (state hash) are written at their first
-- take: an action that has none is at attempt 0, no stalls, which saves a field, and for a
-- session's first action a whole key, per pending action.
-- The session's first stage claims it for its tenant, in this step: its field in its
-- partition's sessions hash (the owner record) and, for a tenant that keeps one, its member in
-- the tenant's index of the partition. Refused with nothing changed: a session of another
-- tenant; a session with no owner record but keys of its own (its record was lost: another
-- tenant must not take it over, an operator restores it); an id that holds another spec (its
-- counter was set back: the new action would replace or vanish behind an old one).
-- KEYS[1] stack (zset: the lowest score is the head)   KEYS[2] actions (hash)
-- KEYS[3] history (stream)   KEYS[4] the partition's sessions (hash: session -> tenant)
-- KEYS[5] the tenant's index in the partition (set of sessions; written only when indexed)
-- KEYS[6] the partition's expiries (zset "<session>/<id>" -> expiry ms: the one record of a
--         ttl, read by every reader and by the sweep)
-- KEYS[7] the expiries' mark (string, ms: none is due before it), lowered to a new expiry
-- KEYS[8] the partition's event feed (stream)
-- ARGV[1] history maxlen   ARGV[2] tenant   ARGV[3] session (the expiries member is
-- "<session>/<id>")   ARGV[4] indexed: "1" when the tenant keeps an index, else ""
-- ARGV[5] the feed's maxlen   ARGV[6] at: the feed entries' time (s)
-- ARGV[7..] four per action: its id ("pending-action:<tool>:<seq>"), its spec JSON, its ttl
-- in ms or "" for none (the expiry is reckoned on the server's clock, so a client's clock can
-- be off without moving it), its created_at (s) for the feed
-- Errors: POISON (a key of another type): nothing changed
-- Returns: one number per action: the stack depth right after its push, or 0 when its id
-- holds this very spec already (a retried call whose first try went through; nothing changed
-- for it). Refused, nothing changed at all: {STAGE.FOREIGN} (another tenant's session),
-- {STAGE.UNOWNED} (no owner record, keys of its own), {STAGE.COLLISION, id} (that id holds
-- another spec).
local stack, actions, hist, sessions = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local tenants, expiries, expiries_due, feed = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local maxlen, tenant, session, indexed = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local feed_maxlen, at = ARGV[5], ARGV[6]
local quads_at = 7
redis.replicate_commands()

local owner = call_on('HGET', sessions, session)
if owner and owner ~= '' and owner ~= tenant then
  return {STAGE.FOREIGN}
end
local claim = owner ~= tenant
local ttl = false
for i = quads_at + 2, #ARGV, 4 do
  ttl = ttl or ARGV[i] ~= ''
end
-- the keys written after the first write (the feed's; the actions hash checks its own type)
local types = {[stack] = 'zset', [hist] = 'stream'}
if ttl then types[expiries] = 'zset' end
if claim and indexed ~= '' then types[tenants] = 'set' end
check_types(types)
-- one HMGET and one HSET for the lot, not an HSETNX each: a command costs Redis far more to
-- call from a script, and to write to the AOF, than its arguments do
local ids = {}
for i = quads_at, #ARGV, 4 do ids[#ids + 1] = ARGV[i] end
local there = call_on('HMGET', actions, unpack(ids))
if not owner and redis.call('EXISTS', stack, actions, hist) > 0 then
  return {STAGE.UNOWNED}
end
local out, new, fields, fresh = {}, {}, {}, {}
for k, id in ipairs(ids) do
  local at_k = quads_at + 4 * (k - 1)  -- the id's index in ARGV
  local spec = ARGV[at_k + 1]
  local held = there[k] or fresh[id]
  if held then
    if held ~= spec then return {STAGE.COLLISION, id} end
    out[k] = 0
  else
    fresh[id] = spec
    new[#new + 1] = at_k
    fields[#fields + 1] = id
    fields[#fields + 1] = spec
    out[k] = 1
  end
end
if #new == 0 then
  return out
end
-- the feed's entries first: the first write checks its own key's type (POISON, nothing
-- written), which saves a TYPE call on every stage
for _, i in ipairs(new) do
  append(feed, EVENT.STAGED, 'at', at, 'session', session, 'tenant', tenant, 'id', ARGV[i],
    'tool', string.match(ARGV[i], '^pending%-action:(.+):%d+$') or '', 'kind', 'action',
    'created_at', ARGV[i + 3])
end
trim(feed, feed_maxlen)
redis.call('HSET', actions, unpack(fields))
if claim then
  redis.call('HSET', sessions, session, tenant)
  if indexed ~= '' then redis.call('SADD', tenants, session) end
end
-- live again: what retire.lua set to expire stays (PERSIST is a no-op on a key without a ttl)
redis.call('PERSIST', hist)
local pushed = {}
for k, i in ipairs(new) do pushed[k] = ARGV[i] end
local depth = push_head(stack, pushed)
-- a tenant other than the default is named in each staged entry of the history: what the
-- session's owner record is restored from, should it be lost (`pending-actions repair`)
local owned = indexed ~= '' and {'tenant', tenant} or {}
local now = ttl and now_ms()
local soonest
for k, i in ipairs(new) do
  local id = ARGV[i]
  out[(i - quads_at) / 4 + 1] = depth + k
  if ARGV[i + 2] ~= '' then
    local due = now + tonumber(ARGV[i + 2])
    redis.call('ZADD', expiries, due, session .. '/' .. id)
    append(hist, EVENT.STAGED, 'id', id, 'expires_at', due, unpack(owned))
    soonest = math.min(soonest or due, due)
  else
    append(hist, EVENT.STAGED, 'id', id, unpack(owned))
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
