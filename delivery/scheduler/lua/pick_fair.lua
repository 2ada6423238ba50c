-- pick_fair.lua: hand out up to max_items leases, one tenant turn at a time.
-- ARGV[4] worker id, [5] max_items, [6] turn size, [7] retry minimum share (ppm),
-- [8] fallback weight, [9] lease seconds, [10] promote limit, [11] reclaim limit,
-- [12] wake limit (rate/pause wake-ups per pick).
-- Returns {lease members, deadline, wait seconds}.
local worker = ARGV[4]
local max_items = tonumber(ARGV[5])
local turn_size = tonumber(ARGV[6])
local share = tonumber(ARGV[7])
local fallback_weight = tonumber(ARGV[8])
local deadline = NOW + tonumber(ARGV[9])

promote_due(tonumber(ARGV[10]))
reclaim_expired(tonumber(ARGV[11]))
wake_due(tonumber(ARGV[12]))
ENDPOINTS = {} -- see endpoint_state: from here on, only this pick's leases change them

-- Fresh first, but while both kinds wait, a credit of `share` per dispatch buys a retry
-- whenever it reaches one whole dispatch: retries get at least that share, exactly.
-- `rotations` holds the lengths of the tenant's two rotations, `credit` its retry credit
-- (see the turn below).
local function choose_kind(credit, rotations)
  local fresh = rotations.f > 0
  local retry = rotations.r > 0
  if fresh and retry then
    if credit + share >= PPM then return 'r', true end
    return 'f', true
  end
  if fresh then return 'f', false end
  if retry then return 'r', false end
  return nil, false
end

-- The lane at the head of rotation `rot` (kind k) leaves it.
local function leave(rotations, rot, k)
  redis.call('LPOP', rot)
  rotations[k] = rotations[k] - 1
end

local out = {}
local v = vtime()
-- Bounds the work of one call: every iteration dispatches, parks one lane or puts one
-- tenant to sleep.
local budget = 2 * max_items + 16
local deferred, waited = 0, 0
while #out < max_items and budget > 0 do
  budget = budget - 1
  local top = redis.call('ZRANGE', K_VT, 0, 0, 'WITHSCORES')
  if not top[1] then break end
  local t, score = top[1], tonumber(top[2])
  if score > v then v = score end
  local tk = tenant_key(t)
  -- `u`: the used part of a turn that max_items cut short; it resumes in this pick.
  local row = redis.call('HMGET', tk, 'w', 'u', 'rr', 'c', 'f', 'r')
  local credit = num(row[4])
  local weight = num(row[1])
  if t == FALLBACK then weight = fallback_weight end
  if weight < 1 then weight = 1 end
  -- A full turn (turn_size deliveries) advances the tenant by 1/weight: weight w gets
  -- w turns per lap of the others' one.
  local step = 1 / (weight * turn_size)
  local used = num(row[2])
  local n = used
  -- The tenant's own rate: each dispatch takes one of its tokens.
  local trate = num(row[3])
  local ttok, tdue = HUGE, nil
  if trate > 0 then ttok, tdue = rates().tokens('t' .. t, trate) end
  -- The lengths of its rotations, read once per turn: only this loop changes them until
  -- the turn ends, so it keeps count instead of asking Redis at every step. Nothing of a
  -- kind queued means no lane of it, so no rotation either (most tenants have no retries).
  local rotations = {f = 0, r = 0}
  if num(row[5]) > 0 then rotations.f = redis.call('LLEN', rot_key(t, 'f')) end
  if num(row[6]) > 0 then rotations.r = redis.call('LLEN', rot_key(t, 'r')) end
  while n < turn_size and #out < max_items and budget > 0 and ttok > 0 do
    local k, both = choose_kind(credit, rotations)
    if not k then break end
    local rot = rot_key(t, k)
    local e = redis.call('LINDEX', rot, 0)
    local free, tok, due, rate, hold = capacity(e, k)
    if free <= 0 or tok <= 0 then
      -- Endpoint full, or no token yet (its rate or a pause): no lease, no attempt. Park
      -- the lane (a pick wakes it when the token is due) and try the tenant's next one.
      leave(rotations, rot, k)
      park(t, e, k, score + n * step)
      if free <= 0 then
        deferred = deferred + 1
      else
        rates().await_token(e, due)
        waited = waited + 1
      end
      budget = budget - 1
    else
      local id = redis.call('LPOP', lane_key(t, e, k))
      local more = note_head(t, e, k, id)
      out[#out + 1] = grant(id, t, e, k, deadline, worker)
      n = n + 1
      local next_due = nil
      if rate > 0 then next_due = rates().take('e' .. e, rate, hold) end
      if trate > 0 then
        tdue = rates().take('t' .. t, trate)
        ttok = ttok - 1
      end
      if both then
        local delta = share
        if k == 'r' then delta = share - PPM end
        credit = credit + delta
        redis.call('HINCRBY', tk, 'c', delta)
      end
      -- Rotate: the lane leaves the rotation when empty, parks now if this lease filled
      -- its endpoint or took its last token (cheaper than discovering it next turn), else
      -- goes to the back.
      if not more then
        leave(rotations, rot, k)
      elseif free <= 1 then
        -- Work is left waiting for this endpoint's cap: that is a deferral too.
        leave(rotations, rot, k)
        park(t, e, k, score + n * step)
        deferred = deferred + 1
      elseif tok <= 1 then
        leave(rotations, rot, k)
        park(t, e, k, score + n * step)
        rates().await_token(e, next_due)
        waited = waited + 1
      else
        -- (A rotation of one lane is its own back already.)
        if rotations[k] > 1 then redis.call('LMOVE', rot, rot, 'LEFT', 'RIGHT') end
      end
    end
  end
  local rotating = rotations.f + rotations.r > 0
  if not rotating then
    redis.call('ZREM', K_VT, t)
  else
    local keep = score
    if n >= turn_size then
      keep = score + n * step
    elseif n > used then
      redis.call('HSET', tk, 'u', n) -- keeps its score: still first in line
    end
    if ttok <= 0 then
      -- Out of tokens: leave the turn order until the next is due; others get its turns.
      rates().tenant_sleep(t, keep, tdue)
      waited = waited + 1
    elseif n >= turn_size then
      redis.call('ZADD', K_VT, keep, t)
    end
  end
  if used > 0 and (n >= turn_size or not rotating) then redis.call('HDEL', tk, 'u') end
end

ENDPOINTS = nil
STATS_SET.V = v
count_stat('deferrals', deferred)
count_stat('rate_waits', waited)
-- Nothing left in the turn order: say how long to sleep. After a full pick too, if
-- anything waits for a token (a rate-limited worker then needn't pick again to find out).
local wait = 0
if (#out < max_items or live[K_DUE] ~= false) and redis.call('EXISTS', K_VT) == 0 then
  wait = next_event_wait()
end
return {out, string.format('%.6f', deadline), string.format('%.6f', wait)}
