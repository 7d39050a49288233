-- name: mark_expiries
-- Set a partition's expiry mark (Keys.expiries_due) from its index, after the sweep read it: the
-- lowest expiry there that the sweep is not waiting on, or, if sooner, when it looks again at those
-- it waits on (actions in flight past their ttl); NOTHING_DUE when there is neither. In one step
-- with the read, so a stage in between (which lowers the mark itself) is never overwritten.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   expiries      the partition's expiries (zset "<session>/<id>" -> expiry ms)
--   expiries_due  its mark (string, ms)
-- ARGV
--   look_again_ms     when the sweep looks again at the members it waits on (ms), or NOTHING_DUE
--   ...waiting        those members
-- Returns: the mark set, in ms.
local waiting, waited = {}, #ARGV - waiting_at + 1
for i = waiting_at, #ARGV do waiting[ARGV[i]] = true end
-- one entry more than are waited on: the first that is not waited on is among them
local first = call_on('ZRANGE', expiries, 0, waited, 'WITHSCORES')
local mark = look_again_ms
for j = 1, #first, 2 do
  if not waiting[first[j]] then
    if tonumber(first[j + 1]) < tonumber(mark) then mark = first[j + 1] end
    break
  end
end
redis.call('SET', expiries_due, mark)
return tonumber(mark)
