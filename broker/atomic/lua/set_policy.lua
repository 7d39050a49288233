-- name: set_policy
-- A new version of a tenant's policy, kept beside every earlier one, and the index's entry for the
-- tenant, in one step (both keys carry the {policies} tag). The caller validated the document
-- (broker/policy/rules.py). The partitions' markers are raised after it, by mark_policy.lua (or by
-- housekeeping, from the index, should the caller stop first).
-- flags: none
-- roles: producer, serve, auth
-- KEYS
--   doc      the tenant's policy (hash: version -> the last number, <N> -> version N's record,
--              current -> the newest record)
--   current  the policy index (hash: tenant -> current version)
-- ARGV
--   tenant
--   rest    the new record's JSON after its version: ',"set_at":...,"by":...,"document":{...}}'
-- Errors: POISON (a key of another type), a version field that is no number: nothing changed
-- Returns: the new version number
check_types({[current] = 'hash'})
local version = call_on('HINCRBY', doc, 'version', 1)
local record = '{"version":' .. version .. rest
redis.call('HSET', doc, tostring(version), record, 'current', record)
redis.call('HSET', current, tenant, version)
return version
