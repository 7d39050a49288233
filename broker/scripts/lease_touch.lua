-- lease_touch: make sure the global lease index points recovery at a session that has (or is
-- about to have) a lease ending at ARGV[2]. Lowers the score to the deadline; if the entry is
-- already due, moves it by 1 ms instead, so that a recovery pass that read the old score and
-- found nothing cannot remove it (lease_hint.lua only acts on the score it read).
-- KEYS[1] leases (zset session -> earliest deadline ms)
-- ARGV[1] session  ARGV[2] lease deadline ms
-- Returns: 1 when the index was changed, 0 when it already covered the deadline.
redis.replicate_commands()
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
local deadline = tonumber(ARGV[2])
if not cur or tonumber(cur) > deadline then
  redis.call('ZADD', KEYS[1], deadline, ARGV[1])
  return 1
end
local t = redis.call('TIME')
if tonumber(cur) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
  redis.call('ZADD', KEYS[1], tonumber(cur) - 1, ARGV[1])
  return 1
end
return 0
