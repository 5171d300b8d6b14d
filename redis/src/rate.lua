-- GCRA over Redis TIME: one key per bucket holding its theoretical
-- arrival time (TAT) in microseconds.
-- KEYS[1] the bucket; ARGV[1] the emission interval (µs per unit),
-- ARGV[2] the units asked, ARGV[3] the burst (a minute's allowance, µs).
-- Returns {1, 0} when the units were taken, {0, wait µs} when not.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local units = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + interval * units
local allow_at = new_tat - burst
if allow_at > now then
  return {0, allow_at - now}
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {1, 0}
