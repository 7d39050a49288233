-- finalize: record an outcome that consumes its target (applied, discarded, stale, or a failed
-- directive) and reply to the resolver. Fenced: a token whose lease is gone (recovered, or a
-- duplicate) changes nothing.
-- KEYS[1] inflight (hash)  KEYS[2] actions (hash)  KEYS[3] state (hash)  KEYS[4] history
-- KEYS[5] reply (list)    KEYS[6] the partition's lease index (zset)
-- ARGV[1] lease token  ARGV[2] reply JSON  ARGV[3] reply ttl s  ARGV[4] history maxlen
-- ARGV[5] event (EVENT.APPLIED | EVENT.DISCARDED | EVENT.STALE | EVENT.FAILED for a directive)
-- ARGV[6] action id  ARGV[7] attempt  ARGV[8] index member "<session>/<token>"
-- ARGV[9...] more field, value pairs for the history entry
-- Returns: 1 when recorded, 0 when the token was stale (only an EVENT.LATE_REFUSED entry).
local lease = json_field('lease', KEYS[1], ARGV[1])
if not lease then
  history(KEYS[4], ARGV[4], EVENT.LATE_REFUSED, 'id', ARGV[6], 'attempt', ARGV[7],
    'outcome', ARGV[5])
  return 0
end
local consumed = lease.kind ~= 'standing'
-- the history entry is the first write; every other key written is checked before it. An
-- action's counters are in the state hash only if it had gone back before (take: counted)
local expected = {[5] = 'list', [6] = 'zset'}
if consumed then
  expected[2] = 'hash'
  if lease.counted ~= false then expected[3] = 'hash' end
end
check_types(expected)
local fields = {'id', lease.id, 'attempt', lease.attempt, 'request', lease.req}
for i = 9, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
if lease.by and lease.by ~= '' then
  fields[#fields + 1] = 'by'
  fields[#fields + 1] = lease.by
end
history(KEYS[4], ARGV[4], ARGV[5], unpack(fields))
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[8])
if consumed then
  redis.call('HDEL', KEYS[2], lease.id)
  if lease.counted ~= false then redis.call('HDEL', KEYS[3], lease.id) end
end
redis.call('RPUSH', KEYS[5], ARGV[2])
redis.call('EXPIRE', KEYS[5], ARGV[3])
return 1
