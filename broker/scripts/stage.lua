-- stage: push a new pending action on the head of its session's stack. Its counters (state
-- hash) are written at its first take: an action that has none is at attempt 0, no stalls,
-- which saves a field, and for a session's first action a whole key, per pending action.
-- The session's first stage makes it its tenant's (its field in its partition's sessions
-- hash); a stage for another tenant is refused.
-- KEYS[1] stack (list)   KEYS[2] actions (hash)   KEYS[3] history (stream)
-- KEYS[4] expiry (zset: id -> expiry ms, for actions staged with a ttl)
-- KEYS[5] the partition's sessions (hash: session -> tenant)
-- KEYS[6] the partition's expiries (zset)
-- ARGV[1] action id      ARGV[2] spec JSON        ARGV[3] history maxlen   ARGV[4] tenant
-- ARGV[5] ttl in ms, "" for none: the expiry is reckoned on the server's clock, so a client's
-- clock can be off without moving it
-- ARGV[6] session (the expiries member is "<session>/<id>")
-- Errors: POISON (a key of another type): nothing changed
-- Returns: the stack depth after the push, 0 when the id is staged already (a retried call
-- whose first try went through: ids come from a counter, so it is ours) and nothing changed,
-- -1 when the session belongs to another tenant (nothing changed).
redis.replicate_commands()

-- a pcall's reply; POISON, as check_types says it, when KEYS[i] holds another type. The read
-- of the sessions hash and the first write (the actions hash) check their own key's type, so
-- TYPE is asked only of the keys written later
local function typed(reply, i)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      poison('type', KEYS[i], redis.call('TYPE', KEYS[i]).ok)
    end
    error(reply)
  end
  return reply
end

local ttl = ARGV[5] ~= ''
check_types(ttl and {'list', nil, 'stream', 'zset', nil, 'zset'} or {'list', nil, 'stream'})
local owner = typed(redis.pcall('HGET', KEYS[5], ARGV[6]), 5)
if owner and owner ~= '' and owner ~= ARGV[4] then
  return -1
end
if typed(redis.pcall('HSETNX', KEYS[2], ARGV[1], ARGV[2]), 2) == 0 then
  return 0
end
if owner ~= ARGV[4] then
  redis.call('HSET', KEYS[5], ARGV[6], ARGV[4])
end
-- live again: what retire.lua set to expire stays (PERSIST is a no-op on a key without a ttl)
redis.call('PERSIST', KEYS[3])
local depth = redis.call('LPUSH', KEYS[1], ARGV[1])
if ttl then
  local at = now_ms() + tonumber(ARGV[5])
  redis.call('ZADD', KEYS[4], at, ARGV[1])
  redis.call('ZADD', KEYS[6], at, ARGV[6] .. '/' .. ARGV[1])
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1], 'expires_at', at)
else
  history(KEYS[3], ARGV[3], EVENT.STAGED, 'id', ARGV[1])
end
return depth
