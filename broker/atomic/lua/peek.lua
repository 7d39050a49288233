-- peek: what the next resolve would target, without taking it (read only). The head is the
-- first stacked id that pending.lua would show too: one whose spec is gone, or that is past
-- its ttl, is skipped, never named.
-- KEYS[1] directive (string)  KEYS[2] stack (zset: the lowest score is the head)
-- KEYS[3] actions (hash)  KEYS[4] the partition's expiries (zset "<session>/<id>" -> expiry ms)
-- ARGV[1] session
-- Returns: {"directive", id, spec JSON} | {"head", id} | {}
local directive, stack, actions, expiries = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local session = ARGV[1]
redis.replicate_commands()
local id = redis.call('GET', directive)
if id then
  local spec = redis.call('HGET', actions, id)
  if spec then return {'directive', id, spec} end
end
local now = now_ms()
local start = 0
while true do
  local ids = redis.call('ZRANGE', stack, start, start + 15)
  if #ids == 0 then return {} end
  for _, one in ipairs(ids) do
    if redis.call('HEXISTS', actions, one) == 1
        and not past_ttl(expiries, session .. '/' .. one, now) then
      return {'head', one}
    end
  end
  start = start + 16
end
