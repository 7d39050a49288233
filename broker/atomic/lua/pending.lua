-- name: pending
-- Read a session's actions in one consistent view (read only).
-- flags: no-writes, allow-oom
-- roles: producer, serve
-- KEYS
--   stack     (zset: the lowest score is the head)
--   inflight  (hash)
--   actions   (hash)
--   state     (hash)
--   expiries  the partition's expiries (zset "<session>/<id>" -> expiry ms)
--   revoked   the partition's revoked grants (set): approvals given through them are not shown
-- ARGV
--   limit    max stack entries to return
--   session
-- Returns: flat list of quadruples {where, id, spec JSON, state JSON} (a spec does not store
-- its id: it is the field it is under); where is "in_flight" for leased
-- actions (listed first) or "pending" for stacked ones (head first). A stacked action past its
-- ttl is not shown: it is gone from that moment, whether or not the sweep has ended it yet.
redis.replicate_commands()
local now = now_ms()
local out = {}
-- an action's counters as they count: without approvals through a revoked token (only
-- counters that name grants are decoded)
local function counted(raw)
  if not string.find(raw, '"grants"', 1, true) then return raw end
  local ok, st = pcall(cjson.decode, raw)
  if ok and type(st) == 'table' and drop_revoked(st, revoked) then return cjson.encode(st) end
  return raw
end
local leases = redis.call('HVALS', inflight)
for _, raw in ipairs(leases) do
  local ok, lease = pcall(cjson.decode, raw)  -- an unreadable lease is parked by its worker
  if ok and type(lease) == 'table' and lease.kind == 'action' then
    local spec = redis.call('HGET', actions, lease.id)
    if spec then
      out[#out + 1] = 'in_flight'
      out[#out + 1] = lease.id
      out[#out + 1] = spec
      -- in flight, an action's counters are its lease's (take.lua)
      local ok2, st = pcall(cjson.decode, redis.call('HGET', state, lease.id) or '{}')
      if not ok2 or type(st) ~= 'table' then st = {} end
      st.attempts = lease.attempt
      out[#out + 1] = cjson.encode(st)
    end
  end
end
local ids = redis.call('ZRANGE', stack, 0, tonumber(limit) - 1)
for _, id in ipairs(ids) do
  local spec = redis.call('HGET', actions, id)
  if spec and not past_ttl(expiries, session .. '/' .. id, now) then
    out[#out + 1] = 'pending'
    out[#out + 1] = id
    out[#out + 1] = spec
    out[#out + 1] = counted(redis.call('HGET', state, id) or '{}')
  end
end
return out
