-- The fleet's retry budget: tower's TpsBudget as one script. Deposits and
-- withdrawals land in time slots (ten per ttl); a slot older than the ttl
-- no longer counts. A withdrawal is granted while the slots' sum plus the
-- reserve (min_per_sec * ttl) covers it.
-- KEYS[1] the slots hash. ARGV: deposits, wanted withdrawals, ttl_ms,
-- percent in thousandths, reserve in thousandths, withdrawals a replica
-- already granted from its local fallback budget (debited here).
-- Returns {withdrawals granted, the withdrawals the shared budget would still
-- grant after this call (never below 0)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deposits, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local ttl, percent, reserve = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local debit = tonumber(ARGV[6])
local slot_ms = math.max(math.floor(ttl / 10), 1)
local current = math.floor(now / slot_ms)
local sum = 0
local slots = redis.call('HGETALL', KEYS[1])
for i = 1, #slots, 2 do
  local slot = tonumber(slots[i])
  if slot <= current - 10 then
    redis.call('HDEL', KEYS[1], slots[i])
  else
    sum = sum + tonumber(slots[i + 1])
  end
end
local added = deposits * percent - debit * 1000
sum = sum + added
local grant = 0
if want > 0 then
  grant = math.max(math.min(want, math.floor((sum + reserve) / 1000)), 0)
end
local change = added - grant * 1000
if change ~= 0 then
  redis.call('HINCRBY', KEYS[1], tostring(current), change)
end
redis.call('PEXPIRE', KEYS[1], ttl * 2)
local level = math.max(math.floor((sum - grant * 1000 + reserve) / 1000), 0)
return { grant, level }
