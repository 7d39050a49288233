-- upgrade: turn a partition's sessions index of an older version (a SET of session names, each
-- session's tenant claim in a string key of its own) into the HASH session -> tenant that this
-- version reads, in one step. A session without a claim (only a slot was set) gets "".
-- KEYS[1] the partition's sessions index (set, becomes a hash)
-- KEYS[2...] each session's old tenant key (string), in ARGV's order
-- ARGV[1...] the session names, all the set's members as read just before
-- Returns: the number of sessions moved; 0 when KEYS[1] is no set (nothing to upgrade);
-- -1 when the set's members changed since they were read (read them again)
local sessions = KEYS[1]
local tenant_keys_at = 2
local sessions_at = 1
local named = #ARGV - sessions_at + 1
if redis.call('TYPE', sessions).ok ~= 'set' then
  return 0
end
if redis.call('SCARD', sessions) ~= named then
  return -1
end
local pairs_ = {}
for i = sessions_at, #ARGV do
  local session = ARGV[i]
  if redis.call('SISMEMBER', sessions, session) == 0 then
    return -1
  end
  local tenant = call_on('GET', KEYS[tenant_keys_at + i - sessions_at])
  pairs_[#pairs_ + 1] = session
  pairs_[#pairs_ + 1] = tenant or ''
end
redis.call('DEL', sessions)
-- in slices: unpack has a limit far below a partition's sessions
for i = 1, #pairs_, 1000 do
  redis.call('HSET', sessions, unpack(pairs_, i, math.min(i + 999, #pairs_)))
end
for i = tenant_keys_at, #KEYS do
  redis.call('DEL', KEYS[i])
end
return named
