-- Action claims and transitions, each atomic. KEYS[1] the record hash,
-- KEYS[2] its attempts list (same hash tag).
-- ARGV[1] op: claim | report | resolve | get; ARGV[2] ttl_ms of finished
-- records; ARGV[3] attempt id ('' for none); ARGV[4] max attempts kept.
--   claim:   ARGV[5] tool, ARGV[6] lease_ms, ARGV[7] arguments digest ('' for none)
--   report:  ARGV[5] run, ARGV[6] new kind (succeeded|failed|unknown),
--            ARGV[7] state json, ARGV[8] retryable (0/1)
--   resolve: ARGV[5] tool, ARGV[6] lease_ms, ARGV[7] arguments digest,
--            ARGV[8] run, ARGV[9] answer (succeeded|not_applied|still_unknown),
--            ARGV[10] state json
-- Replies: {tag, before, after, run, payload}; tags: acquired, in_progress,
-- succeeded, failed, unknown (claims), ok, not_found, conflict (reports),
-- tool_mismatch (payload: the recorded tool), arguments_differ,
-- record (get: tool, state json, run, arguments digest, attempts...).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rec, attempts = KEYS[1], KEYS[2]
local op, ttl, attempt, max_attempts = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])

local function note_attempt()
  if attempt == '' then return end
  local list = redis.call('LRANGE', attempts, 0, -1)
  for _, a in ipairs(list) do
    if a == attempt then return end
  end
  redis.call('RPUSH', attempts, attempt)
  redis.call('LTRIM', attempts, -max_attempts, -1)
end

-- Finished records expire; running and unknown ones never do.
local function set_state(kind, json, retryable)
  local before = redis.call('HGET', rec, 'kind') or 'not_started'
  redis.call('HSET', rec, 'kind', kind, 'state', json, 'retryable', retryable)
  if kind ~= 'running' then redis.call('HDEL', rec, 'lease') end
  if kind == 'succeeded' or kind == 'failed' then
    redis.call('PEXPIRE', rec, ttl)
    redis.call('PEXPIRE', attempts, ttl)
  else
    redis.call('PERSIST', rec)
    redis.call('PERSIST', attempts)
  end
  return before
end

local function start_run(run, lease)
  redis.call('HSET', rec, 'run', run, 'lease', now + lease)
  local before = set_state('running', '{"state":"running"}', '0')
  return { 'acquired', before, 'running', tostring(run), '' }
end

-- The same id with other arguments is another effect: refused. A record
-- or a claim without a digest checks nothing.
local function args_differ(args)
  local recorded = redis.call('HGET', rec, 'args')
  return args ~= '' and recorded and recorded ~= args
end

local function claim(tool, lease, args)
  if redis.call('EXISTS', rec) == 0 then
    -- An expired record is gone: a fresh action, run 1.
    redis.call('DEL', attempts)
    redis.call('HSET', rec, 'tool', tool)
    if args ~= '' then redis.call('HSET', rec, 'args', args) end
    note_attempt()
    return start_run(1, lease)
  end
  local recorded = redis.call('HGET', rec, 'tool')
  if recorded ~= tool then return { 'tool_mismatch', '', '', '0', recorded or '' } end
  if args_differ(args) then return { 'arguments_differ', '', '', '0', '' } end
  note_attempt()
  local kind = redis.call('HGET', rec, 'kind')
  local run = tonumber(redis.call('HGET', rec, 'run'))
  if kind == 'running' then
    if tonumber(redis.call('HGET', rec, 'lease') or '0') <= now then
      -- The owner vanished without reporting: the effect may have happened.
      local before = set_state('unknown', '{"state":"unknown"}', '0')
      return { 'unknown', before, 'unknown', tostring(run), '' }
    end
    return { 'in_progress', '', '', tostring(run), '' }
  elseif kind == 'succeeded' then
    return { 'succeeded', '', '', tostring(run), redis.call('HGET', rec, 'state') }
  elseif kind == 'failed' and redis.call('HGET', rec, 'retryable') ~= '1' then
    return { 'failed', '', '', tostring(run), redis.call('HGET', rec, 'state') }
  elseif kind == 'unknown' then
    return { 'unknown', '', '', tostring(run), '' }
  end
  return start_run(run + 1, lease)
end

if op == 'claim' then
  return claim(ARGV[5], tonumber(ARGV[6]), ARGV[7])
elseif op == 'report' then
  if redis.call('EXISTS', rec) == 0 then return { 'not_found', '', '', '0', '' } end
  local run = tonumber(redis.call('HGET', rec, 'run'))
  local kind = redis.call('HGET', rec, 'kind')
  -- Only the owner of the current run may report, and only while the
  -- outcome is open; a late report on an unknown run is the truth.
  if run ~= tonumber(ARGV[5]) or (kind ~= 'running' and kind ~= 'unknown') then
    return { 'conflict', kind, '', tostring(run), '' }
  end
  note_attempt()
  local before = set_state(ARGV[6], ARGV[7], ARGV[8])
  return { 'ok', before, ARGV[6], tostring(run), '' }
elseif op == 'resolve' then
  local tool, lease, args = ARGV[5], tonumber(ARGV[6]), ARGV[7]
  if redis.call('EXISTS', rec) == 1
    and tonumber(redis.call('HGET', rec, 'run')) == tonumber(ARGV[8])
    and redis.call('HGET', rec, 'kind') == 'unknown'
    and redis.call('HGET', rec, 'tool') == tool
    and not args_differ(args) then
    note_attempt()
    local run = tonumber(ARGV[8])
    if ARGV[9] == 'succeeded' then
      local before = set_state('succeeded', ARGV[10], '0')
      return { 'succeeded', before, 'succeeded', tostring(run), ARGV[10] }
    elseif ARGV[9] == 'still_unknown' then
      return { 'unknown', '', '', tostring(run), '' }
    end
    return start_run(run + 1, lease)
  end
  -- Moved on (or gone) meanwhile: answer as a claim would now.
  return claim(tool, lease, args)
elseif op == 'get' then
  if redis.call('EXISTS', rec) == 0 then return { 'none', '', '', '0', '' } end
  local list = redis.call('LRANGE', attempts, 0, -1)
  local h = redis.call('HMGET', rec, 'tool', 'state', 'run', 'args')
  local out = { 'record', h[1] or '', h[2] or '', h[3] or '0', h[4] or '' }
  for _, a in ipairs(list) do table.insert(out, a) end
  return out
end
return redis.error_reply('unknown action op ' .. op)
