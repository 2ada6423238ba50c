-- maintain.lua: the upkeep every pick does first, bounded per call, so no separate
-- reaper or promoter process is needed (each pick moves the clock-driven state forward).

-- Move up to `limit` due delayed deliveries into their lanes (a retry enters its
-- tenant's retry lane for that endpoint).
local function promote_due(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    redis.call('ZREM', K_DELAYED, member)
    local id, t, e, k = string.match(member, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
    count_in_row(t, 'd', -1)
    enter(t, e, k, id)
  end
end

-- Reclaim up to `limit` expired leases (a crashed or stuck worker): the delivery goes back
-- to the head of its lane and the slot is freed for parked lanes.
local function reclaim_expired(limit)
  local expired = redis.call('ZRANGEBYSCORE', K_LEASES, '-inf', NOW, 'LIMIT', 0, limit)
  -- Newest id first, so that pushing each to the head leaves the oldest in front.
  table.sort(expired, function(a, b) return a > b end)
  local freed = {}
  for _, member in ipairs(expired) do
    local id, t, e, k = release(member)
    give_back_done() -- its slot is free before its lane comes back (activate reads it)
    reenter(t, e, k, id)
    freed[#freed + 1] = e
  end
  local woken = 0
  if MODE == 'fair' then
    for _, e in ipairs(freed) do woken = woken + fill(e) end
  end
  wake(woken)
end

-- Rates and pauses, bounded: forget token clocks that have caught up with now (none left
-- means a full bucket, so this changes nothing but memory; each entry is removed once),
-- and wake up to `limit` endpoints and tenants whose next token is due: an endpoint's
-- parked lanes are offered its slots and tokens again (fill), a tenant rejoins vt. FIFO
-- mode keeps `due` only to tell workers how long to sleep.
local function wake_due(limit)
  if redis.call('EXISTS', K_TAT, K_HOLD, K_DUE) == 0 then
    live = {[K_TAT] = false, [K_HOLD] = false, [K_DUE] = false}
    return
  end
  redis.call('ZREMRANGEBYSCORE', K_TAT, '-inf', rates().now_us)
  redis.call('ZREMRANGEBYSCORE', K_HOLD, '-inf', NOW)
  live = {}
  if MODE == 'fifo' then
    redis.call('ZREMRANGEBYSCORE', K_DUE, '-inf', NOW + EPS)
    return
  end
  local due = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', NOW + EPS, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    local id = string.sub(member, 2)
    if string.sub(member, 1, 1) == 'e' then
      redis.call('ZREM', K_DUE, member)
      live[K_DUE] = nil
      fill(id) -- may set a later due time again (a slot but still no token)
    else
      rates().tenant_wake(id)
    end
  end
end
