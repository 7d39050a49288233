-- stage: push new pending actions of one session on the head of its stack, in the order given
-- (the last one given ends up the head). Their counters (state hash) are written at their
-- first take: an action that has none is at attempt 0, no stalls, which saves a field, and for
-- a session's first action a whole key, per pending action.
-- The session's first stage makes it its tenant's (its field in its partition's sessions
-- hash); a stage for another tenant is refused.
-- KEYS[1] stack (zset: the lowest score is the head)   KEYS[2] actions (hash)
-- KEYS[3] history (stream)   KEYS[4] the partition's sessions (hash: session -> tenant)
-- KEYS[5] the partition's expiries (zset "<session>/<id>" -> expiry ms: the one record of a
--         ttl, read by every reader and by the sweep)
-- KEYS[6] the expiries' mark (string, ms: none is due before it), lowered to a new expiry
-- ARGV[1] history maxlen   ARGV[2] tenant   ARGV[3] session (the expiries member is
-- "<session>/<id>")
-- ARGV[4..] three per action: its id, its spec JSON, its ttl in ms or "" for none (the expiry
-- is reckoned on the server's clock, so a client's clock can be off without moving it)
-- Errors: POISON (a key of another type): nothing changed
-- Returns: one number per action: the stack depth right after its push, 0 when its id is
-- staged already (a retried call whose first try went through: ids come from a counter, so it
-- is ours; nothing changed for it), -1 when the session belongs to another tenant (nothing
-- changed at all).
local stack, actions, hist, sessions = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local expiries, expiries_due = KEYS[5], KEYS[6]
local maxlen, tenant, session = ARGV[1], ARGV[2], ARGV[3]
local triples_at = 4
redis.replicate_commands()

-- a pcall's reply; POISON, as check_types says it, when key holds another type. The read
-- of the sessions hash and the first write (the actions hash) check their own key's type, so
-- TYPE is asked only of the keys written later
local function typed(reply, key)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      poison('type', key, redis.call('TYPE', key).ok)
    end
    error(reply)
  end
  return reply
end

local ttl = false
for i = triples_at + 2, #ARGV, 3 do
  ttl = ttl or ARGV[i] ~= ''
end
check_types(ttl and {[stack] = 'zset', [hist] = 'stream', [expiries] = 'zset'}
  or {[stack] = 'zset', [hist] = 'stream'})
local out = {}
local owner = typed(redis.pcall('HGET', sessions, session), sessions)
if owner and owner ~= '' and owner ~= tenant then
  for i = triples_at, #ARGV, 3 do out[#out + 1] = -1 end
  return out
end
-- one HMGET and one HSET for the lot, not an HSETNX each: a command costs Redis far more to
-- call from a script, and to write to the AOF, than its arguments do
local ids = {}
for i = triples_at, #ARGV, 3 do ids[#ids + 1] = ARGV[i] end
local there = typed(redis.pcall('HMGET', actions, unpack(ids)), actions)
local new, fields, fresh = {}, {}, {}
for k, id in ipairs(ids) do
  if there[k] or fresh[id] then
    out[k] = 0
  else
    local at = triples_at + 3 * (k - 1)  -- the id's index in ARGV
    fresh[id] = true
    new[#new + 1] = at
    fields[#fields + 1] = id
    fields[#fields + 1] = ARGV[at + 1]
    out[k] = 1
  end
end
if #new == 0 then
  return out
end
redis.call('HSET', actions, unpack(fields))
if owner ~= tenant then
  redis.call('HSET', sessions, session, tenant)
end
-- live again: what retire.lua set to expire stays (PERSIST is a no-op on a key without a ttl)
redis.call('PERSIST', hist)
local pushed = {}
for k, i in ipairs(new) do pushed[k] = ARGV[i] end
local depth = push_head(stack, pushed)
local now = ttl and now_ms()
local soonest
for k, i in ipairs(new) do
  out[(i - triples_at) / 3 + 1] = depth + k
  if ARGV[i + 2] ~= '' then
    local at = now + tonumber(ARGV[i + 2])
    redis.call('ZADD', expiries, at, session .. '/' .. ARGV[i])
    append(hist, EVENT.STAGED, 'id', ARGV[i], 'expires_at', at)
    soonest = math.min(soonest or at, at)
  else
    append(hist, EVENT.STAGED, 'id', ARGV[i])
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
