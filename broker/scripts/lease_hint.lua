-- lease_hint: move a session's entry in the global lease index, unless a taker changed it since
-- it was read. A hint only: recovery also sweeps all sessions now and then.
-- KEYS[1] leases (zset session -> earliest deadline ms)
-- ARGV[1] session  ARGV[2] score read before  ARGV[3] next deadline ms, or 0 to remove
-- Returns: 1 when updated, 0 when the score had changed.
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not cur or tonumber(cur) ~= tonumber(ARGV[2]) then
  return 0
end
if tonumber(ARGV[3]) > 0 then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return 1
