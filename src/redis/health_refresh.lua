-- The fleet's health view, step one: whether it changed since the caller's
-- version, and if so which keys it holds (the caller then reads them with
-- health_entries.lua, declaring each entry key).
-- KEYS[1] index set, KEYS[2] version counter. ARGV[1] the caller's version.
-- Returns {version} when nothing changed, else {version, member, ...}.
local version = redis.call('GET', KEYS[2]) or '0'
if version == ARGV[1] then return { version } end
local out = { version }
for _, member in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  table.insert(out, member)
end
return out
