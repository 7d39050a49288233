-- name: note_outcome
-- A worker that applied a call of an agent-framework run keeps the handler's result text with the
-- run, for the process that resumes it (which may start hours later). Written only while the
-- session has a run; a later attempt of the same action overwrites it.
-- flags: allow-oom
-- roles: worker
-- KEYS
--   run  the session's run (hash)
-- ARGV
--   action_id  action id
--   text       the result's text
-- Returns: 1 when kept, 0 when the session has no run.
check_types({[run] = 'hash'})
if redis.call('EXISTS', run) == 0 then
  return 0
end
redis.call('HSET', run, 'out:' .. action_id, text)
return 1
