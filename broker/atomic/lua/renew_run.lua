-- name: renew_run
-- The process continuing a session's agent-framework run keeps holding it while it works (every
-- third of its lease), so that a continuation longer than one lease is still the only one. Fenced:
-- a lease another process took since is not extended.
-- flags: allow-oom
-- roles: producer, serve
-- KEYS
--   run  the session's run (hash)
-- ARGV
--   token     lease token
--   lease_ms  lease ms
-- Returns: 1 when extended, 0 when the lease is not this token's any more.
redis.replicate_commands()
check_types({[run] = 'hash'})
if redis.call('HGET', run, 'lease') ~= token then
  return 0
end
redis.call('HSET', run, 'until', now_ms() + lease_ms)
return 1
