-- set_policy: a new version of a tenant's policy, kept beside every earlier one, and the
-- index's entry for the tenant, in one step (both keys carry the {policies} tag). The caller
-- validated the document (broker/rules.py). The partitions' markers are raised after it, by
-- mark_policy.lua (or by housekeeping, from the index, should the caller stop first).
-- KEYS[1] the tenant's policy (hash: version -> the last number, <N> -> version N's record,
--         current -> the newest record)
-- KEYS[2] the policy index (hash: tenant -> current version)
-- ARGV[1] tenant
-- ARGV[2] the new record's JSON after its version: ',"set_at":...,"by":...,"document":{...}}'
-- Errors: POISON (a key of another type), a version field that is no number: nothing changed
-- Returns: the new version number
local doc, current = KEYS[1], KEYS[2]
local tenant, rest = ARGV[1], ARGV[2]
check_types({[current] = 'hash'})
local version = call_on('HINCRBY', doc, 'version', 1)
local record = '{"version":' .. version .. rest
redis.call('HSET', doc, tostring(version), record, 'current', record)
redis.call('HSET', current, tenant, version)
return version
