-- The fleet's health view, when it changed since the caller's version.
-- KEYS[1] index set, KEYS[2] version counter. ARGV[1] the caller's version,
-- ARGV[2] the entry key prefix (same hash tag as KEYS, so the same slot).
-- Returns {version} when nothing changed, else
-- {version, member, until_left_ms, probe_left_ms, streak, cooldowns, class, ...}.
local version = redis.call('GET', KEYS[2]) or '0'
if version == ARGV[1] then return { version } end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = { version }
for _, member in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local h = ARGV[2] .. member
  local f = redis.call('HMGET', h, 'until', 'probe', 'streak', 'cooldowns', 'class')
  if redis.call('EXISTS', h) == 0 then
    redis.call('SREM', KEYS[1], member)
  else
    local left = -1
    if f[1] then left = math.max(tonumber(f[1]) - now, 0) end
    local probe_left = -1
    local probe = tonumber(f[2] or '0') or 0
    if probe > now then probe_left = probe - now end
    for _, v in ipairs({ member, tostring(left), tostring(probe_left), f[3] or '0', f[4] or '0', f[5] or '' }) do
      table.insert(out, v)
    end
  end
end
return out
