-- ack.lua: finished leases (delivered, dead or held): drop each lease, free its slot,
-- and un-park lanes waiting on the endpoint. ACK.outcome (counted, for metrics that
-- must survive worker restarts), then the lease members from ACK.members on.
-- Returns the ids whose lease was already lost (expired and reclaimed).
-- Each lease's ZREM says whether it was still held (a lease named twice is held once).
-- Whether answered.lua freed their slots already is read for all of them at once
-- (SMISMEMBER), and they leave the answered set with one SREM (of all of them, answered
-- or not: removing what is not there costs a look-up). The tenants' and endpoints'
-- counts go down with one HMGET and one HSET of `count` (write_counts), the slots once
-- per endpoint (give_back).
local lost, held = {}, {}
for i = ACK.members, #ARGV do
  if redis.call('ZREM', K_LEASES, ARGV[i]) == 1 then
    held[#held + 1] = ARGV[i]
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
local was_answered = call_list('SMISMEMBER', K_ANSWERED, held)
call_many('SREM', K_ANSWERED, held)

local freed = {}
-- Accepted (any outcome but a dead letter or a delivery held for a disabled endpoint):
-- each endpoint's retry budget earns its share per delivery, and an accepted retry's own
-- token back (see retry_budget in lib.lua).
local outcome = ARGV[ACK.outcome]
local earned = outcome ~= 'dead' and outcome ~= 'held' and tally()
local tenants_earned = earned and tally() -- tenants' budgets: accepted retries alone
for i, member in ipairs(held) do
  local _, t, e, k = parse_lease(member)
  count_in('e' .. e, -1)
  count_in('t' .. t, -1)
  if was_answered[i] == 0 then
    give_back(e, k)
    if freed[#freed] ~= e then freed[#freed + 1] = e end
  end
  if earned then
    local by = earned.by[e]
    if not by then earned.order[#earned.order + 1] = e end
    by = (by or 0) + RETRY_BUDGET_SHARE
    if k == 'r' then
      by = by + 1
      if not tenants_earned.by[t] then tenants_earned.order[#tenants_earned.order + 1] = t end
      tenants_earned.by[t] = (tenants_earned.by[t] or 0) + 1
    end
    earned.by[e] = by
  end
end
give_back_done() -- before an endpoint's row may go: its retry slots' count lives there
-- Each id of `got` (a tally, rows in `store`) earns its tokens; `gained(id, before)` for
-- those whose budget reached a new whole token.
local function earn(store, got, budget, change, gained)
  if not got or #got.order == 0 then return end
  for _, id in ipairs(store.read_unless(got.order, budget_full)) do
    local row = store.of(id)
    local before = budget(row)
    if not row.missing and change(row, got.by[id]) then
      store.changed(id, row)
      if math.floor(budget(row)) > math.floor(before) then gained(id, before) end
    end
  end
end
local tenants_woken = 0
earn(TENANT_ROWS, tenants_earned, tenant_retry_budget, change_tenant_retry_budget,
  function(t, before)
    -- A tenant asleep for want of a retry token has one now: it need not wait for the
    -- refill's due time (one asleep for its rate finds none and sleeps again).
    if before < 1 and MODE == 'fair' and is_asleep(t) then
      tenants_woken = tenants_woken + rates().tenant_wake(t)
    end
  end)
-- A retry lane parked for an endpoint's new token may go. Only a budget that had no whole
-- token parks retry lanes: one with a token to spare wakes nothing by earning more.
earn(ENDPOINT_ROWS, earned, retry_budget, change_retry_budget, function(e, before)
  if before < 1 and freed[#freed] ~= e then freed[#freed + 1] = e end
end)
-- A tenant or endpoint with nothing left anywhere in the schedule leaves no key behind.
local tenants_gone, endpoints_gone = {}, {}
for _, field in ipairs(write_counts()) do
  local id = string.sub(field, 2)
  if string.byte(field, 1) == 116 then -- 't'
    tenants_gone[#tenants_gone + 1] = id
  else
    endpoints_gone[#endpoints_gone + 1] = id
  end
end
count_stat('tenants', -TENANT_ROWS.drop(tenants_gone))
ENDPOINT_ROWS.drop(endpoints_gone)
if #held > 0 then count_stat('out:' .. ARGV[ACK.outcome], #held) end
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif redis.call('EXISTS', K_FIFO) == 1 then
  woken = #freed
end
wake(woken + tenants_woken)
return lost
