-- prelude: the definitions the scripts share (Redis has no include). broker/atomic/source.py puts
-- in front of each script the ones it uses. So: one definition per block, blocks apart by a blank
-- line, and only definitions, no commands. The code names of the Python enums, EVENT.X
-- (broker/events.py), TAKE.X, BEGIN.X, RECOVER.X and EXPIRE.X (broker/atomic/replies.py), are
-- written into the text as their values by broker/atomic/source.py, which refuses a name the enum
-- lacks when the text is built: no table is built at each call.

-- the counters of an action never taken yet (the state hash has no entry for it)
local NEW_STATE = '{"attempts":0,"stalls":0}'

-- the server's clock in ms (a script that calls this starts with redis.replicate_commands())
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the ('by', name) pair of a lease resolved by someone who said who (serve's token name), for
-- the end of a history entry; nothing otherwise
local function by_of(lease)
  if lease.by and lease.by ~= '' then return 'by', lease.by end
end

-- add a handler task (an encoded dramatiq message) to a task stream, under the field the
-- streams broker reads (FIELD in workers/taskbroker.py)
local function add_task(key, message)
  redis.call('XADD', key, '*', 'm', message)
end

-- add a resolve request (a ResolveRequest's JSON) to a partition's request stream, under the
-- field the resolve worker reads (ResolveRequest.FIELD in broker/models.py)
local function add_request(key, request)
  redis.call('XADD', key, '*', 'r', request)
end

-- ack a resolve request (XACK, and XDEL: a served request leaves the stream) in the step that
-- served it; entry "" when the caller acks it itself (after sending the task on a broker of
-- its own, or a request read from another stream than its partition's)
local function ack_request(requests, group, entry)
  if entry ~= '' then
    redis.call('XACK', requests, group, entry)
    redis.call('XDEL', requests, entry)
  end
end

-- Redis keeps what a script wrote before an error stopped it, so a script reads and checks
-- everything before its first write, and stops with POISON (nothing changed) on a record that
-- does not parse: the caller parks it (park.lua) and carries on. A string (level 0: no
-- position), which failure() passes on as the reply's text
local function poison(what, key, field)
  error('POISON ' .. what .. ' ' .. key .. ' ' .. (field or ''), 0)
end

-- redis.call on one key, stopping with POISON (naming the key) when it holds another type.
-- Scripts read before they write, so a read that fails so has changed nothing; so has a
-- script's first write. A key read or written first this way needs no TYPE call beforehand:
-- check_types is only for the keys a script writes after its first write.
local function call_on(cmd, key, ...)
  local reply = redis.pcall(cmd, key, ...)
  if type(reply) == 'table' and reply.err then
    if string.find(reply.err, 'WRONGTYPE', 1, true) then
      poison('type', key, redis.call('TYPE', key).ok)
    end
    error(reply.err, 0)
  end
  return reply
end

-- end a lease: its record in the session's inflight hash and its member "<session>/<token>"
-- in the partition's lease index go in one step, so that recovery, which looks in the index,
-- never finds one without the other
local function end_lease(inflight, leases, token, member)
  redis.call('HDEL', inflight, token)
  redis.call('ZREM', leases, member)
end

-- push a reply on the list the waiting caller BLPOPs (a request's reply key), kept reply_ttl_s
-- for a caller that comes late. Through call_on: in take.lua it is the first write, where a key
-- of another type must change nothing and say POISON; the other scripts checked its type first,
-- but for park.lua, which checks none (such a key stops it with POISON, no longer WRONGTYPE)
local function send_reply(key, text, reply_ttl_s)
  call_on('RPUSH', key, text)
  redis.call('EXPIRE', key, reply_ttl_s)
end

-- append an event to a session's history, trimmed to about maxlen entries; a script that
-- writes history first needs no TYPE check of it (see call_on)
local function history(key, maxlen, event, ...)
  call_on('XADD', key, 'MAXLEN', '~', maxlen, '*', 'event', event, ...)
end

-- append an event to a stream as history() does, untrimmed: for a script that appends many,
-- then trims once (trim). An XADD that trims is written to the AOF with the trim's arguments,
-- and checks for a node to drop at every entry
local function append(key, event, ...)
  call_on('XADD', key, '*', 'event', event, ...)
end

-- push ids on the head of a session's stack, in the order given (the last one ends up the
-- head); returns the depth before. The stack is a zset whose lowest score is the head, kept a
-- zset for memory: one with a single member is a listpack, ~90 B smaller than a one-item list
-- on Redis 7.0. Scores are integers (exact in a double to 2^53), the head's less one per push
local function push_head(key, ids)
  local depth = redis.call('ZCARD', key)
  local low = 1  -- an empty stack's first push scores 0
  if depth > 0 then low = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]) end
  local args = {}
  for k, id in ipairs(ids) do
    args[2 * k - 1], args[2 * k] = low - k, id
  end
  redis.call('ZADD', key, unpack(args))
  return depth
end

-- put an action a lease held back where it was taken from, under the same id: an action on the
-- head of the stack, a directive in its slot unless a newer one was set meanwhile, which wins;
-- a standing handler never left its slot. With drop, the superseded directive's spec and
-- counters go (readd, recover: the lease says it was the directive, so nothing else holds it).
-- Without, they stay: park.lua knows only an id whose lease it could not read, and a standing
-- handler's id looks like a directive's, so it deletes no action it did not park. Returns
-- whether the action is back (false: a newer directive holds the slot)
local function put_back(stack, directive, actions, state, kind, id, drop)
  if kind == 'action' then
    push_head(stack, {id})
  elseif kind == 'directive' and not redis.call('SET', directive, id, 'NX') then
    if drop then
      redis.call('HDEL', actions, id)
      redis.call('HDEL', state, id)
    end
    return false
  end
  return true
end

-- trim a stream that append() wrote to to about maxlen entries
local function trim(key, maxlen)
  redis.call('XTRIM', key, 'MAXLEN', '~', maxlen)
end

-- the JSON at field of a hash, decoded; nil when absent, POISON when it does not parse
local function json_field(what, key, field)
  local raw = call_on('HGET', key, field)
  if not raw then return nil, nil end
  local ok, value = pcall(cjson.decode, raw)
  if not ok or type(value) ~= 'table' then poison(what, key, field) end
  return value, raw
end

-- every key given (key name -> type) is of that type or absent; else POISON, before any write
local function check_types(expected)
  for key, want in pairs(expected) do
    local found = redis.call('TYPE', key).ok
    if found ~= 'none' and found ~= want then poison('type', key, found) end
  end
end

-- an action's counters {attempts, stalls, last_error}, decoded, and their raw text (nil when
-- the state hash has none: NEW_STATE); POISON when they do not parse as counters (numbers, and
-- a string or nothing as the error), as Python reads them
local function counters(state_key, id)
  local st, raw = json_field('state', state_key, id)
  if not st then return cjson.decode(NEW_STATE), nil end
  for _, n in ipairs({'attempts', 'stalls'}) do
    if st[n] ~= nil and type(st[n]) ~= 'number' then poison('state', state_key, id) end
  end
  if st.last_error ~= nil and st.last_error ~= cjson.null and type(st.last_error) ~= 'string' then
    poison('state', state_key, id)
  end
  return st, raw
end

-- people's approvals in counters ``st`` (take.lua) that came through a serve token revoked
-- since, its grant id in the partition's ``revoked`` set, leave approved_by and grants (each
-- nil once empty: cjson would write an empty table as an object); true when any left
local function drop_revoked(st, revoked)
  if type(st.grants) ~= 'table' or type(st.approved_by) ~= 'table' then return false end
  local kept, dropped = {}, false
  for _, name in ipairs(st.approved_by) do
    local grant = st.grants[name]
    if type(grant) == 'string' and call_on('SISMEMBER', revoked, grant) == 1 then
      st.grants[name], dropped = nil, true
    else
      kept[#kept + 1] = name
    end
  end
  if dropped then
    st.approved_by = #kept > 0 and kept or nil
    st.grants = next(st.grants) and st.grants or nil
  end
  return dropped
end

-- count a person's approval into an action's counters st, after drop_revoked(st): approver
-- joins approved_by (with the grant it came through, for a revocation to void) unless there
-- already. People approve what they saw, so an approval with a patch (an edit: the revision one
-- more) or of the other verb (approving: nil for apply) starts them again at this approver.
-- take.lua decides with it whether this is the last approval needed, and approve.lua records,
-- with it again, one that is not. Returns how many approvals st holds now, and whether approver
-- had given one already
local function count_approval(st, approver, grant, verb, patched)
  local names = type(st.approved_by) == 'table' and st.approved_by or {}
  local grants = type(st.grants) == 'table' and st.grants or {}
  if patched ~= '' or (st.approving or 'apply') ~= verb then
    names, grants = {}, {}
  end
  if patched ~= '' then
    st.edit, st.revision = patched, (st.revision or 0) + 1
  end
  local given = false
  for _, n in ipairs(names) do given = given or n == approver end
  if not given then
    names[#names + 1] = approver
    if grant ~= '' then grants[approver] = grant end
  end
  st.approved_by, st.grants = names, next(grants) and grants or nil
  st.approving = verb ~= 'apply' and verb or nil
  return #names, given
end

-- the counters of a leased attempt, as its claim answers them: take keeps an action's counters
-- in its lease while it is in flight and says whether the state hash holds more of them
-- (counted), only then read (POISON before a write); attempts is the lease's attempt
local function lease_counters(state_key, lease)
  local st = lease.counted == false and cjson.decode(NEW_STATE) or counters(state_key, lease.id)
  st.attempts = lease.attempt
  return st
end

-- dead-letter an action whose spec is missing (deleted by hand, lost by a Redis that lost
-- writes): its id, on a stack or in a lease, is all that is left of it. Nothing can run; the
-- dead letters and the history say what became of it, so that no action vanishes unseen.
-- hist nil: no history entry here (recover.lua writes its own dead-lettered entry, with the
-- attempt and the request, as it does for every outcome)
local function spec_missing(dead, hist, maxlen, id, now)
  redis.call('LPUSH', dead, cjson.encode({id = id, reason = 'spec missing', at = now}))
  if hist then
    history(hist, maxlen, EVENT.DEAD_LETTERED, 'id', id, 'reason', 'spec missing')
  end
end

-- whether an action staged with a ttl is past it at server time ``now`` (ms): from that moment
-- every reader treats it as gone, whether or not the sweep has ended it yet. Its one record is
-- its member "<session>/<id>" in its partition's expiries zset, score the expiry
local function past_ttl(expiries, member, now)
  local at = call_on('ZSCORE', expiries, member)
  return at ~= false and tonumber(at) <= now
end

-- end an action past its ttl that is on no stack any more: spec and counters go, no handler
-- runs, the expired zset remembers it (trimmed to ``memory_ms``) for a late expect_id
local function end_expired(actions, state, expiries, member, expired, hist, maxlen, memory_ms,
                           id, now)
  local at = redis.call('ZSCORE', expiries, member)
  redis.call('HDEL', actions, id)
  redis.call('HDEL', state, id)
  redis.call('ZREM', expiries, member)
  redis.call('ZADD', expired, now, id)
  redis.call('ZREMRANGEBYSCORE', expired, '-inf', now - tonumber(memory_ms))
  history(hist, maxlen, EVENT.EXPIRED, 'id', id, 'expires_at', at)
end

-- the error reply of an error raised in a script (by Lua, by a redis.call, by poison()), starting
-- with its code (POISON, OOM, WRONGTYPE, ERR for Lua's own): broker/atomic/source.py runs every
-- script inside pcall and returns this, so the caller reads the same reply from Redis 6.2 and 7
-- (6.2's own handler fails on an error raised as a table, "attempt to concatenate", and puts where
-- a command failed before its text: "@user_script: 3: -OOM ...\r\n")
local function failure(raised)
  local text = type(raised) == 'table' and raised.err or tostring(raised)
  text = string.gsub(string.gsub(text, '^@user_script: %d+: %-', ''), '%s+$', '')
  if not string.find(text, '^%u[%u_]* ') then text = 'ERR ' .. text end
  return redis.error_reply(text)
end
