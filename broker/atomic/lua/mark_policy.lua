-- mark_policy: raise a partition's marker of a tenant's policy version (what stage.lua checks
-- a stage's decisions against) to a version set by set_policy.lua; never lowers it, so two
-- sets racing, or housekeeping beside a set, end on the highest version.
-- KEYS[1] the partition's policy markers (hash: tenant -> version)
-- ARGV[1] tenant  ARGV[2] version
-- Errors: POISON (a key of another type): nothing changed
-- Returns: 1 when raised, 0 when the marker had that version or a later one
local markers = KEYS[1]
local tenant, version = ARGV[1], ARGV[2]
local was = tonumber(call_on('HGET', markers, tenant) or '0') or 0
if was >= tonumber(version) then return 0 end
redis.call('HSET', markers, tenant, version)
return 1
