-- take: pick the resolve target atomically (directive, else stack head, else standing handler)
-- and lease it to one attempt. The target leaves the stack/slot but its spec stays in the
-- actions hash, so it is never missing: it is either stacked or in flight.
-- KEYS[1] directive (string)  KEYS[2] stack (list)  KEYS[3] standing (string)
-- KEYS[4] actions (hash)      KEYS[5] state (hash)  KEYS[6] inflight (hash)
-- KEYS[7] history (stream)    KEYS[8] request marker (string, dedupes redelivered requests)
-- KEYS[9] reply (list)        KEYS[10] expiry (zset)  KEYS[11] expired (zset)
-- ARGV[1] request id  ARGV[2] "apply"|"discard"  ARGV[3] lease token
-- ARGV[4] dispatch timeout ms (the lease until a worker starts the attempt)
-- ARGV[5] marker ttl seconds  ARGV[6] history maxlen  ARGV[7] reason
-- ARGV[8] extra as a JSON string (kept opaque: cjson would rewrite {} as [])
-- ARGV[9] reply JSON for "nothing to target"  ARGV[10] reply ttl seconds
-- ARGV[11] expect_id ("" for none): take only if this id is the target, else change nothing
-- ARGV[12] by: who resolves ("" for unsaid), kept in the lease and the history
-- ARGV[13] reply JSON for "expect_id is not the target"
-- ARGV[14] reply JSON for "expect_id expired"  ARGV[15] expired memory ms
-- Errors: POISON (a key of another type, a lease or counters that do not parse): nothing changed
-- Returns: {TAKE.OK, id, kind, attempt, deadline ms, token} | {TAKE.NONE} (replied here)
--          | {TAKE.CONFLICT} (replied here) | {TAKE.DUP}
-- A request seen before (redelivered, or retried after a lost reply) takes nothing new: it gets
-- its earlier answer back while that is still actionable (the same lease if no worker has
-- started it, so it can be dispatched again; NONE again), else DUP.
-- A stacked action past its ttl is gone for take as for every reader: passed over, and ended
-- here (history "expired") when popped on the way.
redis.replicate_commands()
check_types({'string', 'list', 'string', 'hash', 'hash', 'hash', 'stream', 'string', 'list',
             'zset', 'zset'})
local now = now_ms()
-- a slot or stack entry may outlive its spec, or its ttl: such an id is skipped
local function held(id)
  return id and redis.call('HEXISTS', KEYS[4], id) == 1 and not past_ttl(KEYS[10], id, now)
end

local prev = redis.call('GET', KEYS[8])
if prev == 'none' then
  return {TAKE.NONE}
elseif prev == 'conflict' then
  return {TAKE.CONFLICT}
elseif prev then
  local lease = json_field('lease', KEYS[6], prev)
  -- taken before any ttl passed: its spec is all it needs to be dispatched again
  if lease and lease.state == 'dispatched' and redis.call('HEXISTS', KEYS[4], lease.id) == 1 then
    return {TAKE.OK, lease.id, lease.kind, tostring(lease.attempt), tostring(lease.deadline),
            prev}
  end
  return {TAKE.DUP}
end

-- the target, read before anything changes (scripts check before they write): its id, its
-- kind, whether a stale directive is in the slot, and how many stale stack entries lie above
local function target()
  local id = redis.call('GET', KEYS[1])
  local stale_directive = id ~= false
  if held(id) then return id, 'directive', false, 0 end
  local i = 0
  while true do
    id = redis.call('LINDEX', KEYS[2], i)
    if not id then break end
    if held(id) then return id, 'action', stale_directive, i end
    i = i + 1
  end
  id = redis.call('GET', KEYS[3])
  if held(id) then return id, 'standing', stale_directive, i end
  return nil, nil, stale_directive, i
end

local id, kind, stale_directive, skipped = target()
if ARGV[11] ~= '' and id ~= ARGV[11] then
  redis.call('SET', KEYS[8], 'conflict', 'EX', ARGV[5])
  local gone = redis.call('ZSCORE', KEYS[11], ARGV[11]) or past_ttl(KEYS[10], ARGV[11], now)
  redis.call('RPUSH', KEYS[9], gone and ARGV[14] or ARGV[13])
  redis.call('EXPIRE', KEYS[9], ARGV[10])
  return {TAKE.CONFLICT}
end
local st = id and counters(KEYS[5], id)  -- POISON here changes nothing
if stale_directive or kind == 'directive' then
  redis.call('DEL', KEYS[1])
end
if skipped > 0 then
  -- stale entries above the target: an expired action among them ends here
  for _, x in ipairs(redis.call('LPOP', KEYS[2], skipped)) do
    if redis.call('HEXISTS', KEYS[4], x) == 1 then
      end_expired(KEYS[4], KEYS[5], KEYS[10], KEYS[11], KEYS[7], ARGV[6], ARGV[15], x, now)
    end
  end
end
if kind == 'action' then
  redis.call('LPOP', KEYS[2])
end
if not id then
  redis.call('SET', KEYS[8], 'none', 'EX', ARGV[5])
  redis.call('RPUSH', KEYS[9], ARGV[9])
  redis.call('EXPIRE', KEYS[9], ARGV[10])
  return {TAKE.NONE}
end
redis.call('SET', KEYS[8], ARGV[3], 'EX', ARGV[5])
st.attempts = (st.attempts or 0) + 1
redis.call('HSET', KEYS[5], id, cjson.encode(st))
local deadline = now + tonumber(ARGV[4])
redis.call('HSET', KEYS[6], ARGV[3], cjson.encode({
  id = id, kind = kind, token = ARGV[3], attempt = st.attempts, req = ARGV[1],
  action = ARGV[2], deadline = deadline, state = 'dispatched', reason = ARGV[7],
  extra = ARGV[8], by = ARGV[12]}))
history(KEYS[7], ARGV[6], EVENT.TAKEN, 'id', id, 'kind', kind, 'action', ARGV[2],
  'attempt', st.attempts, 'request', ARGV[1], by_of({by = ARGV[12]}))
return {TAKE.OK, id, kind, tostring(st.attempts), tostring(deadline), ARGV[3]}
