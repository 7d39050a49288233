-- feed: append entries with the same fields to the event feed, a batch in one call (a stage of
-- many actions: one command to send and to answer, not one per action). The feed is not
-- state, only what webhooks and metrics read, on a slot of its own.
-- KEYS[1] the feed (stream)
-- ARGV[1] maxlen   ARGV[2] n, the number of fields of each entry, the first "event"
-- ARGV[3..2+n] the fields' names   ARGV[3+n..2+2n] for each field, the value it has in every
-- entry, or "" where each entry gives its own (sent once, not once per entry)
-- ARGV[3+2n..] the entries' own values, in the fields' order, as many for each
-- Returns: the number of entries added (none when no field is an entry's own).
local feed = KEYS[1]
local maxlen, field_count = ARGV[1], ARGV[2]
local names_at = 3
local n = tonumber(field_count)
-- where each field's value in every entry starts, and the entries' own values
local common_at, values_at = names_at + n, names_at + 2 * n
-- the fields after the event, names and values, the same for every entry but for the slots in
-- own (the event's own slot is 0)
local fields, own = {}, {}
if ARGV[common_at] == '' then own[1] = 0 end
for i = 1, n - 1 do
  fields[#fields + 1] = ARGV[names_at + i]
  fields[#fields + 1] = ARGV[common_at + i]
  if ARGV[common_at + i] == '' then own[#own + 1] = #fields end
end
local m = #own
if m == 0 then return 0 end  -- (a loop by 0 steps would never end)
local event = ARGV[common_at]
local added = 0
for first = values_at, #ARGV, m do
  for j = 1, m do
    if own[j] == 0 then event = ARGV[first + j - 1] else fields[own[j]] = ARGV[first + j - 1] end
  end
  append(feed, event, unpack(fields))
  added = added + 1
end
trim(feed, maxlen)
return added
