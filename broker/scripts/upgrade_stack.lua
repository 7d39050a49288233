-- upgrade_stack: turn one session's stack of an older version (a LIST, head on the left) into
-- the ZSET this version reads (the lowest score is the head), in one step: its ids keep their
-- order, scored 0, 1, 2, ... from the head. A stack that is no list (a zset already, or none)
-- is left alone, so running this twice, or from two workers at once, moves it once.
-- A list may hold an id twice (a zset cannot): the copy nearer the head is the one kept,
-- which is the one a take would have reached first.
-- KEYS[1] the session's stack (list, becomes a zset)
-- Returns: the number of ids moved; 0 when KEYS[1] is no list (nothing to upgrade)
local stack = KEYS[1]
if redis.call('TYPE', stack).ok ~= 'list' then
  return 0
end
local ids = redis.call('LRANGE', stack, 0, -1)
local args, seen = {}, {}
for _, id in ipairs(ids) do
  if not seen[id] then
    seen[id] = true
    args[#args + 1] = #args / 2
    args[#args + 1] = id
  end
end
redis.call('DEL', stack)
-- in slices: unpack has a limit far below a deep stack
for i = 1, #args, 1000 do
  redis.call('ZADD', stack, unpack(args, i, math.min(i + 999, #args)))
end
return #args / 2
