-- The fleet's health view, step two: the state of the keys step one named.
-- KEYS[1] index of configured keys, KEYS[2] index of client-named keys,
-- KEYS[3..] the entry hashes (same hash tag, so the same slot); ARGV[i] the
-- member of KEYS[i + 2].
-- Returns {member, until_left_ms, probe_left_ms, streak, cooldowns, class, ...}
-- for the entries that still exist; members whose entry expired leave the
-- index.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i, member in ipairs(ARGV) do
  local h = KEYS[i + 2]
  if redis.call('EXISTS', h) == 0 then
    redis.call('ZREM', KEYS[1], member)
    redis.call('ZREM', KEYS[2], member)
  else
    local f = redis.call('HMGET', h, 'until', 'probe', 'streak', 'cooldowns', 'class')
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
