-- One health transition of one gateway key, atomically, in one round trip.
-- KEYS[1] index of configured keys (sorted set by last write), KEYS[2]
-- version counter, KEYS[3] account hash, KEYS[4] model hash (= KEYS[3] for
-- an account key), KEYS[5] index of client-named model keys (sorted set by
-- last write, capped).
-- ARGV: op, account member, model member, then per op:
--   failure: charged ('account'|'model'|'none'), class, hint_ms (-1: none),
--            was_probe, model_not_found, account_ms, threshold, window_ms,
--            base_ms, max_ms, max_probe_ms, client (hex; '': a client of
--            its own each time)
--   committed | whole: (nothing)
--   probe: probe_timeout_ms, probe account (0/1), probe model (0/1)
--   release: (nothing)
-- Last three ARGV: the model key is client-named (0/1), the cap of
-- client-named keys, keep_ms (how long an untouched entry is kept).
-- Returns {version, cooldown_ms (-1: none), member, state..., member, state...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op = ARGV[1]
local members = { ARGV[2], ARGV[3] }
local hashes = { KEYS[3], KEYS[4] }
local same = KEYS[3] == KEYS[4]
local touched = {}
local cooldown = -1

local function num(h, f)
  return tonumber(redis.call('HGET', h, f) or '0') or 0
end
local function touch(i)
  touched[i] = true
end
local function clear_probe(i)
  redis.call('HDEL', hashes[i], 'probe')
  touch(i)
end

if op == 'failure' then
  local charged, class = ARGV[4], ARGV[5]
  local hint, was_probe, mnf = tonumber(ARGV[6]), ARGV[7] == '1', ARGV[8] == '1'
  local account_ms, threshold, window = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
  local base, max = tonumber(ARGV[12]), tonumber(ARGV[13])
  local max_probe, client = tonumber(ARGV[14]), ARGV[15]
  if was_probe then
    clear_probe(1)
    if not same then clear_probe(2) end
  end
  if charged ~= 'none' then
    local i = (charged == 'account') and 1 or 2
    local h = hashes[i]
    touch(i)
    redis.call('HINCRBY', h, 'streak', 1)
    redis.call('HSET', h, 'class', class)
    local cd = -1
    if charged == 'account' or mnf then
      cd = (hint >= 0) and hint or account_ms
    elseif hint >= 0 then
      cd = hint
    else
      -- Hintless failures inside the window, across the whole fleet, each
      -- as 'ms:client'; a client already in the window adds no count, its
      -- count is only renewed.
      local recent = {}
      for item in string.gmatch(redis.call('HGET', h, 'recent') or '', '[^,]+') do
        local at, who = string.match(item, '^(%d+):?(%x*)$')
        if at and tonumber(at) > now - window and (client == '' or who ~= client) then
          table.insert(recent, item)
        end
      end
      table.insert(recent, tostring(now) .. ':' .. client)
      while #recent > threshold do table.remove(recent, 1) end
      redis.call('HSET', h, 'recent', table.concat(recent, ','))
      if #recent >= threshold or was_probe then
        -- Doubling up to the probe interval: a recovered provider is
        -- found soon, however long its outage.
        cd = math.min(base * (2 ^ math.min(num(h, 'cooldowns'), 16)), max_probe)
      end
    end
    if cd >= 0 then
      cd = math.min(cd, max)
      local untl = now + cd
      local current = num(h, 'until')
      if redis.call('HEXISTS', h, 'until') == 1 and current > now then
        -- A failure while the key rests may lengthen the rest, never
        -- shorten it; only a failed probe counts as another cooldown.
        untl = math.max(current, untl)
        if was_probe then redis.call('HINCRBY', h, 'cooldowns', 1) end
      else
        redis.call('HINCRBY', h, 'cooldowns', 1)
      end
      redis.call('HSET', h, 'until', string.format('%d', untl))
      redis.call('HDEL', h, 'recent')
      cooldown = cd
    end
  end
elseif op == 'committed' or op == 'whole' then
  for i = 1, (same and 1 or 2) do
    local h = hashes[i]
    if redis.call('EXISTS', h) == 1 then
      redis.call('HDEL', h, 'until', 'probe')
      if op == 'whole' then
        redis.call('HSET', h, 'streak', 0, 'cooldowns', 0)
        redis.call('HDEL', h, 'recent')
      end
      touch(i)
    end
  end
elseif op == 'probe' then
  local timeout = tonumber(ARGV[4])
  local flags = { ARGV[5] == '1', ARGV[6] == '1' }
  for i = 1, 2 do
    if flags[i] then
      -- Compare-and-set: a live claim (another replica's probe) is kept,
      -- neither replaced nor lengthened; the reply carries it back, so this
      -- replica's view adopts it.
      local held = tonumber(redis.call('HGET', hashes[i], 'probe') or '0') or 0
      if held <= now then
        redis.call('HSET', hashes[i], 'probe', string.format('%d', now + timeout))
      end
      touch(i)
    end
  end
elseif op == 'release' then
  for i = 1, (same and 1 or 2) do
    if redis.call('EXISTS', hashes[i]) == 1 then clear_probe(i) end
  end
else
  return redis.error_reply('unknown health op ' .. op)
end

local version = redis.call('INCR', KEYS[2])
local keep = tonumber(ARGV[#ARGV])
local cap = tonumber(ARGV[#ARGV - 1])
local client_named = ARGV[#ARGV - 2] == '1'
local out = { tostring(version), tostring(cooldown) }
local function state(h)
  local untl = redis.call('HGET', h, 'until')
  local probe = tonumber(redis.call('HGET', h, 'probe') or '0') or 0
  local left = -1
  if untl then left = math.max(tonumber(untl) - now, 0) end
  local probe_left = -1
  if probe > now then probe_left = probe - now end
  return { tostring(left), tostring(probe_left), tostring(num(h, 'streak')),
    tostring(num(h, 'cooldowns')), redis.call('HGET', h, 'class') or '' }
end
for i = 1, 2 do
  if touched[i] and not (i == 2 and same) then
    local h = hashes[i]
    if i == 2 and client_named then
      -- Only so many client-named keys are indexed: the least recently
      -- written leave (their entries expire on their own).
      redis.call('ZADD', KEYS[5], now, members[i])
      local n = redis.call('ZCARD', KEYS[5])
      if n > cap then redis.call('ZREMRANGEBYRANK', KEYS[5], 0, n - cap - 1) end
    else
      redis.call('ZADD', KEYS[1], now, members[i])
    end
    local untl = num(h, 'until')
    redis.call('PEXPIRE', h, math.max(untl - now, 0) + keep)
    table.insert(out, members[i])
    for _, v in ipairs(state(h)) do table.insert(out, v) end
  end
end
return out
