-- maintain.lua: the upkeep every pick does first, bounded per call, so no separate
-- reaper or promoter process is needed (each pick moves the clock-driven state forward).

-- Move up to `limit` due delayed deliveries into their lanes (a retry enters its
-- tenant's retry lane for that endpoint).
local function promote_due(limit)
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', NOW, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    redis.call('ZREM', K_DELAYED, member)
    local id, t, e, k = string.match(member, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
    redis.call('HINCRBY', tenant_key(t), 'd', -1)
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
    reenter(t, e, k, id)
    freed[#freed + 1] = e
  end
  local woken = 0
  if MODE == 'fair' then
    for _, e in ipairs(freed) do woken = woken + fill(e) end
  end
  wake(woken)
end
