-- name: sweep
-- One session's leases against its partition's lease index, for the slow sweep of in-flight state
-- (workers/sweep.py). Every script that writes or ends a lease writes its index entry in the same
-- step, but an entry deleted by hand (or lost by a Redis that lost writes) leaves its lease, and
-- the action it holds, in flight for ever: recovery looks only at the index. Each lease without its
-- entry gets it back, at the lease's deadline (0 for a lease that does not parse: due at once, so
-- that recovery parks it); recovery does the rest as usual. An entry without its lease is
-- recovery's already (recover.lua drops it when it comes due).
-- flags: allow-oom
-- roles: worker
-- KEYS
--   inflight  (hash)
--   leases    the partition's lease index (zset)
-- ARGV
--   session  (a lease's index member is "<session>/<token>")
-- Returns: how many index entries were put back.
local held = call_on('HGETALL', inflight)
check_types({[leases] = 'zset'})
local back = 0
for i = 1, #held, 2 do
  local member = session .. '/' .. held[i]
  if not redis.call('ZSCORE', leases, member) then
    local ok, lease = pcall(cjson.decode, held[i + 1])
    redis.call('ZADD', leases, ok and type(lease) == 'table' and tonumber(lease.deadline) or 0,
      member)
    back = back + 1
  end
end
return back
