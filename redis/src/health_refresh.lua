-- The fleet's health view, step one: whether it changed since the caller's
-- version, and if so which keys it holds (the caller then reads them with
-- health_entries.lua, declaring each entry key).
-- KEYS[1] index of configured keys, KEYS[2] index of client-named model
-- keys (capped), KEYS[3] version counter. ARGV[1] the caller's version.
-- Returns {version} when nothing changed, else
-- {version, configured count, configured member..., client-named member...}.
local version = redis.call('GET', KEYS[3]) or '0'
if version == ARGV[1] then return { version } end
local configured = redis.call('ZRANGE', KEYS[1], 0, -1)
local out = { version, tostring(#configured) }
for _, member in ipairs(configured) do
  table.insert(out, member)
end
for _, member in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  table.insert(out, member)
end
return out
