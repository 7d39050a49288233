-- name: reserve
-- A block of values of a partition's id counter, for a producer to stage with (an id's seq is value
-- * partitions + partition; producers/staging.py). The counter has a copy, its mark, written in the
-- same step: a counter deleted or set back by hand is rebuilt from the mark before any value is
-- handed out, so neither ever goes back and no id is handed out twice. When neither is left (or
-- readable) in a partition that has been used (it has sessions, or entries in its event feed), no
-- value is known to be free: nothing is handed out.
-- flags: none
-- roles: producer, serve
-- KEYS
--   counter   the counter (string)
--   mark      its mark (string)
--   sessions  the partition's sessions (hash)
--   feed      the partition's event feed (stream)
-- ARGV
--   size   how many values
--   floor  a value known to be taken (a collision stage.lua reported to the client), 0 for none
-- Errors: POISON (a key of another type): nothing changed
-- Returns: the block's last value (its first is size - 1 below), or -1 when neither the
-- counter nor its mark can be trusted (nothing changed).

-- a whole number >= 0 at key, or nil (absent, or not a number: not to be trusted)
local function value(key)
  local n = tonumber(call_on('GET', key) or '')
  if n and n >= 0 and n == math.floor(n) then return n end
end

local held, copy = value(counter), value(mark)
-- (an empty feed says nothing: a webhook consumer's group makes one before any stage)
if not held and not copy and (redis.call('EXISTS', sessions) > 0
    or call_on('XLEN', feed) > 0) then
  return -1
end
local last = math.max(held or 0, copy or 0, tonumber(floor)) + tonumber(size)
local text = string.format('%d', last)  -- digits, never 1e+15
redis.call('SET', counter, text)
redis.call('SET', mark, text)
return last
