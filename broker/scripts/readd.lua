-- readd: a failed attempt puts its target back where it was (stack head, or the directive slot)
-- under the same id, with last_error set, and replies the error to the resolver. One step, so
-- no observer sees the action missing. Fenced by the lease token like finalize.
-- KEYS[1] inflight (hash)  KEYS[2] stack (zset: the lowest score is the head)
-- KEYS[3] directive (string)
-- KEYS[4] actions (hash)   KEYS[5] state (hash)  KEYS[6] history (stream)  KEYS[7] reply (list)
-- KEYS[8] the partition's lease index (zset)
-- ARGV[1] lease token  ARGV[2] error text  ARGV[3] reply JSON  ARGV[4] reply ttl s
-- ARGV[5] history maxlen  ARGV[6] action id  ARGV[7] attempt
-- ARGV[8] index member "<session>/<token>"
-- KEYS[3] is only ever SET NX, which no type refuses.
-- Returns: 1 when re-added, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
local lease = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  history(KEYS[6], ARGV[5], EVENT.LATE_REFUSED, 'id', ARGV[6], 'attempt', ARGV[7],
    'outcome', EVENT.FAILED)
  return 0
end
local kept = call_on('HEXISTS', KEYS[4], lease.id) == 1
local st = kept and counters(KEYS[5], lease.id)  -- POISON before the first write
-- the history entry is the first write; every other key written is checked before it
check_types({[2] = 'zset', [7] = 'list', [8] = 'zset'})
history(KEYS[6], ARGV[5], EVENT.FAILED, 'id', lease.id, 'attempt', lease.attempt,
  'request', lease.req, 'error', ARGV[2], by_of(lease))
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[8])
if kept and lease.kind == 'action' then
  push_head(KEYS[2], {lease.id})
elseif kept and lease.kind == 'directive' then
  -- a newer directive set meanwhile wins; the failed one is dropped
  if not redis.call('SET', KEYS[3], lease.id, 'NX') then
    redis.call('HDEL', KEYS[4], lease.id)
    redis.call('HDEL', KEYS[5], lease.id)
    kept = false
  end
end
if kept then
  -- the counters come back from the lease (take keeps them there while in flight)
  st.attempts = lease.attempt
  st.last_error = ARGV[2]
  redis.call('HSET', KEYS[5], lease.id, cjson.encode(st))
end
redis.call('RPUSH', KEYS[7], ARGV[3])
redis.call('EXPIRE', KEYS[7], ARGV[4])
return 1
