-- Shared by every spend script: the window's counter, named at Redis'
-- clock (TIME), so replicas whose clocks disagree near midnight still
-- share one window. KEYS[1] is the tenant's hash tag `{<prefix>:spend:<t>}`;
-- the counter is KEYS[1] .. ':' .. label, in the same slot. ARGV[1] is the
-- window kind: 'd' (UTC day, `d:YYYY-MM-DD`) or 'm' (UTC month, `m:YYYY-MM`),
-- the labels of SpendWindow::label.
local function window_label(kind, secs)
  -- Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm,
  -- as in SpendWindow::label; every division here is of a non-negative
  -- number, so floor is the integer division of the Rust code).
  local z = math.floor(secs / 86400) + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp + 3
  if mp >= 10 then m = mp - 9 end
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  if kind == 'm' then
    return string.format('m:%04d-%02d', y, m)
  end
  return string.format('d:%04d-%02d-%02d', y, m, d)
end
local function window_key()
  return KEYS[1] .. ':' .. window_label(ARGV[1], tonumber(redis.call('TIME')[1]))
end
