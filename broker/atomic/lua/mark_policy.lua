-- name: mark_policy
-- Raise a partition's marker of a tenant's policy version (what stage.lua checks a stage's
-- decisions against) to a version set by set_policy.lua; never lowers it, so two sets racing, or
-- housekeeping beside a set, end on the highest version.
-- flags: allow-oom
-- roles: producer, worker, serve, auth
-- KEYS
--   markers  the partition's policy markers (hash: tenant -> version)
-- ARGV
--   tenant
--   version
-- Errors: POISON (a key of another type): nothing changed
-- Returns: 1 when raised, 0 when the marker had that version or a later one
local was = tonumber(call_on('HGET', markers, tenant) or '0') or 0
if was >= tonumber(version) then return 0 end
redis.call('HSET', markers, tenant, version)
return 1
