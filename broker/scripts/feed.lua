-- feed: append entries with the same fields to the event feed, a batch in one call (a stage of
-- many actions: one command to send and to answer, not one per action). The feed is not
-- state, only what webhooks and metrics read, on a slot of its own.
-- KEYS[1] the feed (stream)
-- ARGV[1] maxlen   ARGV[2] n, the number of fields of each entry, the first "event"
-- ARGV[3..2+n] the fields' names   ARGV[3+n..] the entries' values, n each, in that order
-- Returns: the number of entries added.
local n = tonumber(ARGV[2])
local entry = {}
local added = 0
for first = 3 + n, #ARGV, n do
  for i = 2, n do
    entry[2 * i - 3], entry[2 * i - 2] = ARGV[2 + i], ARGV[first + i - 1]
  end
  history(KEYS[1], ARGV[1], ARGV[first], unpack(entry))
  added = added + 1
end
return added
