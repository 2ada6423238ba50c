-- pick_fair.lua: hand out up to max_items leases, one tenant turn at a time.
-- Arguments: PICK (protocol.py); the wake limit bounds rate/pause wake-ups per pick.
-- Returns PICK_REPLY: the lease members, their deadline, the seconds a worker may wait.
local worker = ARGV[PICK.worker]
local max_items = tonumber(ARGV[PICK.max_items])
local turn_size = tonumber(ARGV[PICK.turn_size])
local share = tonumber(ARGV[PICK.retry_share_ppm])
local fallback_weight = tonumber(ARGV[PICK.fallback_weight])
-- The deadline as the text the worker gets back, formatted once: each lease's ZADD then
-- converts no number.
local deadline = string.format('%.6f', NOW + tonumber(ARGV[PICK.lease_seconds]))

promote_due(tonumber(ARGV[PICK.promote_limit]))
reclaim_expired(tonumber(ARGV[PICK.reclaim_limit]))
wake_due(tonumber(ARGV[PICK.wake_limit]))
ENDPOINTS = {} -- see endpoint_state: from here on, only this pick's leases change them

-- Fresh first, but while both kinds wait, a credit of `share` per dispatch buys a retry
-- whenever it reaches one whole dispatch: retries get at least that share, exactly.
-- `rotations` holds the lengths of the tenant's two rotations (as rot_state counts them),
-- `credit` its retry credit (see the turn below).
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

-- A pick's turns are the only writer of the keys below until it ends, so it reads each
-- once, keeps it in these tables and writes it back once (see docs/SCHEDULER.md,
-- "Batched within a pick"): its rotations' lengths and heads, the turn order's first few
-- tenants, and the lanes it pops (tenants' rows are lib.lua's, shared with all the code a
-- call runs). The rare paths that let other code read or change them (a tenant asleep for
-- its rate) write everything back first.

-- The turn order (vt): a window of its first WINDOW tenants, ordered as the ZSET orders
-- them (score, then member). A tenant whose new score falls past the window's last drops
-- out of it; an empty window is read again after the held writes are made.
local WINDOW = max_items + 1
local WINDOW_LAST = int(WINDOW - 1)
local vt_window, vt_at, vt_whole, vt_valid = {}, 1, false, false
local vt_writes = tally() -- tenant -> new score, or false to leave vt
local function vt_flush()
  write_scores(K_VT, vt_writes.order, vt_writes.by)
  vt_writes = tally()
end
local function vt_first()
  if not vt_valid or (vt_at > #vt_window and not vt_whole) then
    vt_flush()
    local rows = redis.call('ZRANGE', K_VT, '0', WINDOW_LAST, 'WITHSCORES')
    vt_window, vt_at = {}, 1
    local tenants = {}
    for i = 1, #rows, 2 do
      vt_window[#vt_window + 1] = {rows[i], tonumber(rows[i + 1])}
      tenants[#tenants + 1] = rows[i]
    end
    TENANT_ROWS.read(tenants) -- the window's rows with one HMGET: most will take a turn
    vt_whole = #vt_window < WINDOW
    vt_valid = true
  end
  return vt_window[vt_at]
end
local function vt_before(t, score, other)
  return score < other[2] or (score == other[2] and t < other[1])
end
-- The first tenant's turn ended: it leaves the order (score false) or moves to `score`,
-- found by binary search (a moved tenant mostly goes far back, where inserting is cheap).
local function vt_move_first(t, score)
  if vt_writes.by[t] == nil then vt_writes.order[#vt_writes.order + 1] = t end
  vt_writes.by[t] = score
  local next_one = vt_window[vt_at + 1]
  if score and ((next_one and vt_before(t, score, next_one)) or (not next_one and vt_whole)) then
    vt_window[vt_at][2] = score -- still first (a flood's tenant alone, a heavy weight)
    return
  end
  vt_window[vt_at] = false
  vt_at = vt_at + 1
  if not score then return end
  local size = #vt_window
  if vt_at > size then
    if vt_whole then vt_window[size + 1] = {t, score} end
    return
  end
  if not vt_whole and not vt_before(t, score, vt_window[size]) then return end
  local low, high = vt_at, size + 1
  while low < high do
    local mid = math.floor((low + high) / 2)
    if vt_before(t, score, vt_window[mid]) then high = mid else low = mid + 1 end
  end
  table.insert(vt_window, low, {t, score})
end

-- Rotations: the head and whether another lane follows it, read with one LRANGE when
-- first needed and again once the head left or moved on. `len` is 0, 1, or 2 for "two or
-- more": all a turn asks is whether a rotation has a lane, and whether more than one (to
-- rotate). Just after the head left a rotation of two or more, it is 1, "at least one",
-- and the head is read again before anything asks for more.
local rot_cache = {}
local function rot_read(key, state)
  local got = redis.call('LRANGE', key, '0', '1')
  state.head, state.len = got[1] or false, #got
end
local function rot_state(key)
  local state = rot_cache[key]
  if not state then
    state = {}
    rot_read(key, state)
    rot_cache[key] = state
  end
  return state
end
local function rot_head(rotations, k, key)
  local state = rot_state(key)
  if state.head == nil then
    rot_read(key, state)
    rotations[k] = state.len
  end
  return state.head
end
-- The lane at the head of rotation `rot` (kind k) leaves it.
local function leave(rotations, rot, k)
  redis.call('LPOP', rot)
  local state = rot_state(rot)
  if state.len > 1 then
    state.len, state.head = 1, nil
  else
    state.len, state.head = 0, false
  end
  rotations[k] = state.len
end

-- Lanes: a lane's first pop in a pick takes one id and reads the next (its new head, and
-- whether it has more), like any single pop. A lane popped again in the same pick
-- (one tenant's backlog, a flood) pops the rest of the pick's room at once; what is left
-- over goes back to its head at the end (write_lanes), and that lane's head and its
-- tenant's age are updated then, once per pick.
local lanes, lane_order = {}, {}
local NONE = {} -- no ids popped ahead (shared: never written)
local function pop(t, e, k, room)
  local key = lane_key(t, e, k)
  local lane = lanes[key]
  if not lane then
    -- The common case, a lane popped once per pick: its new head is read and its scores
    -- updated at once, with no record kept (a table per lane costs more than it saves).
    local id = redis.call('LPOP', key)
    local head = redis.call('LINDEX', key, '0')
    note_head(t, e, k, id, head)
    lanes[key] = true
    return id, head ~= false
  end
  if lane == true then
    -- Popped again in this pick: from now on it pops ahead and settles at the end. Its
    -- head's time is the one the first pop recorded.
    lane = {key = key, t = t, e = e, k = k, ids = NONE, at = 1, ended = false}
    lanes[key] = lane
    lane_order[#lane_order + 1] = lane
  end
  local id
  if lane.at <= #lane.ids then
    id = lane.ids[lane.at]
    lane.at = lane.at + 1
  else
    local count = math.max(1, room) + 1
    lane.ids = redis.call('LPOP', key, int(count)) or {}
    lane.ended = #lane.ids < count
    id = lane.ids[1]
    lane.at = 2
  end
  if not lane.first then lane.first = id end
  if lane.at <= #lane.ids then return id, true end
  if lane.ended then return id, false end
  lane.peek = redis.call('LINDEX', key, '0')
  lane.ended = not lane.peek
  return id, lane.peek ~= false
end
-- A lane's head once the pick is over (false: empty).
local function lane_head(lane)
  if lane.at <= #lane.ids then return lane.ids[lane.at] end
  if lane.ended then return false end
  return lane.peek
end
local function write_lanes()
  local tenants = tally() -- tenant -> the oldest head its changed lanes had
  local changed_lanes = {}
  for _, lane in ipairs(lane_order) do
    local head = lane_head(lane)
    local left = {}
    for i = #lane.ids, lane.at, -1 do left[#left + 1] = lane.ids[i] end
    call_many('LPUSH', lane.key, left)
    -- Its head score is in its first popped head's age step.
    if not (head and same_age_step(head, lane.first)) then
      local member = lane.e .. ':' .. lane.k
      if head then
        redis.call('ZADD', head_key(lane.t), int(ulid_ms(head)), member)
      else
        redis.call('ZREM', head_key(lane.t), member)
      end
      -- ULIDs order as their times do: the oldest head popped, uncoded.
      local oldest = tenants.by[lane.t]
      if not oldest then tenants.order[#tenants.order + 1] = lane.t end
      if not oldest or lane.first < oldest then tenants.by[lane.t] = lane.first end
      changed_lanes[lane.t .. ':' .. member] = true
    end
  end
  -- A tenant's age is its oldest lane head's: unchanged when a lane this pick left alone
  -- was at least as old as everything it popped.
  for _, t in ipairs(tenants.order) do
    local first = redis.call('ZRANGE', head_key(t), '0', '0', 'WITHSCORES')
    local stays = first[1] and not changed_lanes[t .. ':' .. first[1]]
      and tonumber(first[2]) <= ulid_ms(tenants.by[t])
    if not stays and first[1] then
      redis.call('ZADD', K_AGE, first[2], t)
    elseif not stays then
      redis.call('ZREM', K_AGE, t)
    end
  end
  lanes, lane_order = {}, {}
end

local out = {}
local v = vtime()
local v_read = v
-- The tenant of the last turn, with what its turns need: a tenant that stays first (a
-- flood's, alone in the order) takes turn after turn without setting them up again.
local last_t, rotations = nil, nil
-- Bounds the work of one call: every iteration dispatches, parks one lane or puts one
-- tenant to sleep.
local budget = 2 * max_items + 16
local deferred, waited = 0, 0
while #out < max_items and budget > 0 do
  budget = budget - 1
  local top = vt_first()
  if not top then break end
  local t, score = top[1], top[2]
  if score > v then v = score end
  -- `u`: the used part of a turn that max_items cut short; it resumes in this pick.
  local row = TENANT_ROWS.of(t)
  local weight = row.w
  if t == FALLBACK then weight = fallback_weight end
  if weight < 1 then weight = 1 end
  -- A full turn (turn_size deliveries) advances the tenant by 1/weight: weight w gets
  -- w turns per lap of the others' one.
  local step = 1 / (weight * turn_size)
  local used = row.u
  local n = used
  -- The tenant's own rate: each dispatch takes one of its tokens.
  local trate = row.rr
  local ttok, tdue = HUGE, nil
  if trate > 0 then ttok, tdue = rates().tokens('t' .. t, trate) end
  -- The lengths of its rotations, which only its own turns change until the pick ends.
  -- Nothing of a kind queued means no lane of it, so no rotation either (most tenants
  -- have no retries).
  if t ~= last_t then
    last_t, rotations = t, {f = 0, r = 0}
    if row.f > 0 then rotations.f = rot_state(rot_key(t, 'f')).len end
    if row.r > 0 then rotations.r = rot_state(rot_key(t, 'r')).len end
  end
  -- Only retries left, and the tenant's retry budget has no whole token: it sleeps.
  local retries_wait = false
  while n < turn_size and #out < max_items and budget > 0 and ttok > 0 do
    local k, both = choose_kind(row.c, rotations)
    if not k then break end
    if k == 'r' and tenant_retry_budget(row) < 1 then
      -- Out of retry tokens: fresh lanes keep the turn (the credit stays for later).
      if rotations.f == 0 then
        retries_wait = true
        break
      end
      k, both = 'f', false
    end
    local rot = rot_key(t, k)
    local e = rot_head(rotations, k, rot)
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
      local id, more = pop(t, e, k, max_items - #out - 1)
      out[#out + 1] = grant(id, t, e, k, deadline, worker)
      n = n + 1
      local next_due = nil
      if rate > 0 then next_due = rates().take('e' .. e, rate, hold) end
      if k == 'r' then
        -- Its retry budget's last whole token: the next one may come later than the rate's.
        local budget = endpoint_state(e).rb
        if budget < 1 then
          local refill = retry_budget_due(budget)
          if not next_due or refill > next_due then next_due = refill end
        end
      end
      if trate > 0 then
        tdue = rates().take('t' .. t, trate)
        ttok = ttok - 1
      end
      if both then
        local delta = share
        if k == 'r' then delta = share - PPM end
        row.c = row.c + delta -- (grant marked the row changed)
      end
      -- Rotate: the lane leaves the rotation when empty, parks now if this lease filled
      -- its endpoint or took its last token (cheaper than discovering it next turn), else
      -- goes to the back.
      if not more then
        leave(rotations, rot, k)
        -- Its last token went to a lane that is now empty: lanes of other tenants parked
        -- on e for a token wake when the next one is due, not only at a lease's end.
        if tok <= 1 and next_due then rates().await_token(e, next_due) end
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
        if rotations[k] > 1 then
          redis.call('LMOVE', rot, rot, 'LEFT', 'RIGHT')
          rot_state(rot).head = nil
        end
      end
    end
  end
  local rotating = rotations.f + rotations.r > 0
  local keep = score
  if n >= turn_size then keep = score + n * step end
  if rotating and n < turn_size and n > used then
    row.u = n -- keeps its score: still first in line
    TENANT_ROWS.changed(t, row)
  end
  if used > 0 and (n >= turn_size or not rotating) then
    row.u = 0
    TENANT_ROWS.changed(t, row)
  end
  if not rotating then
    vt_move_first(t, false)
  elseif ttok <= 0 or retries_wait then
    -- Out of tokens (its rate's, or its retry budget's with only retries left): leave
    -- the turn order until the next is due; others get its turns. That un-parks lanes of
    -- other tenants and may bring tenants back into the order, so everything held back is
    -- written first and read again after.
    local due = nil
    if ttok <= 0 then due = tdue end
    if retries_wait then
      local refill = tenant_retry_budget_due(tenant_retry_budget(row))
      if not due or refill > due then due = refill end
    end
    vt_move_first(t, false)
    vt_flush()
    rates().tenant_sleep(t, keep, due)
    vt_valid, rot_cache, last_t = false, {}, nil
    waited = waited + 1
  elseif n >= turn_size then
    vt_move_first(t, keep)
  end
end

vt_flush()
write_lanes()
flush_grants()
ENDPOINTS = nil
-- Written only when it moved: an idle worker's empty picks then write nothing.
if v ~= v_read then STATS_SET.V = v end
count_stat('deferrals', deferred)
count_stat('rate_waits', waited)
-- Nothing left in the turn order: say how long to sleep. After a full pick too, if
-- anything waits for a token (a rate-limited worker then needn't pick again to find out).
local wait = 0
if (#out < max_items or live[K_DUE] ~= false) and redis.call('EXISTS', K_VT) == 0 then
  wait = next_event_wait()
end
return reply_of(PICK_REPLY, {
  members = out, deadline = deadline, wait_seconds = string.format('%.6f', wait),
})
