-- enqueue.lua: add a batch of deliveries in one round trip.
-- From ARGS_FIRST on, one group of ITEM.SIZE arguments per delivery (protocol.ITEM).
-- Weight, caps and rates ride along with every delivery so that the schedule needs no
-- separate configuration store: what the database said at enqueue time wins.
local woken = 0
local changed = {}
local retimed = {}
-- The item whose configuration this batch applied to each tenant and endpoint last:
-- another item with the same one (a fan-out, a rebuild's run of one tenant's deliveries)
-- only changes the counts. A configuration Redis holds already is not written again.
local tenant_cfg, endpoint_cfg = {}, {}
local function same(j, i, offsets)
  if not j then return false end
  for _, o in ipairs(offsets) do
    if ARGV[j + o] ~= ARGV[i + o] then return false end
  end
  return true
end
local TENANT_CFG = {ITEM.weight, ITEM.tenant_rate}
local ENDPOINT_CFG = {
  ITEM.max_in_flight, ITEM.retry_max_in_flight, ITEM.endpoint_rate, ITEM.adaptive,
}
-- Every tenant's and endpoint's row at once (one HMGET each).
local tenants, endpoints = {}, {}
for i = ARGS_FIRST, #ARGV, ITEM.SIZE do
  tenants[#tenants + 1] = ARGV[i + ITEM.tenant]
  endpoints[#endpoints + 1] = ARGV[i + ITEM.endpoint]
end
TENANT_ROWS.read(tenants)
ENDPOINT_ROWS.read(endpoints)
for i = ARGS_FIRST, #ARGV, ITEM.SIZE do
  local id, t, e = ARGV[i + ITEM.id], ARGV[i + ITEM.tenant], ARGV[i + ITEM.endpoint]
  local k, due = ARGV[i + ITEM.kind], tonumber(ARGV[i + ITEM.due])
  local row = TENANT_ROWS.of(t)

  if not same(tenant_cfg[t], i, TENANT_CFG) then
    tenant_cfg[t] = i
    local trate = tonumber(ARGV[i + ITEM.tenant_rate]) or 0
    local weight = tonumber(ARGV[i + ITEM.weight])
    if row.missing and not row.changed then count_stat('tenants', 1) end
    local old_rate = row.rr
    if row.w ~= weight or old_rate ~= trate then
      row.w, row.rr = weight, trate
      TENANT_ROWS.changed(t, row)
    end
    if trate > 0 then rates().clamp_clock('t' .. t, trate) end
    if old_rate > 0 and old_rate ~= trate then retimed[#retimed + 1] = t end
  end
  if t == FALLBACK then count_stat('fallback_total', 1) end

  if not same(endpoint_cfg[e], i, ENDPOINT_CFG) then
    endpoint_cfg[e] = i
    local erate = tonumber(ARGV[i + ITEM.endpoint_rate]) or 0
    local erow = ENDPOINT_ROWS.of(e)
    local m = tonumber(ARGV[i + ITEM.max_in_flight])
    local rm = tonumber(ARGV[i + ITEM.retry_max_in_flight])
    local same_rate = erow.rr == erate
    local adaptive = ARGV[i + ITEM.adaptive] == '1'
    local was_limit, was_rm = in_flight_limit(erow), erow.rm
    if erow.missing or erow.m ~= m or erow.rm ~= rm or not same_rate
        or adaptive ~= (erow.al > 0) then
      erow.m, erow.rm, erow.rr = m, rm, erate
      set_adaptive(erow, adaptive)
      ENDPOINT_ROWS.changed(e, erow)
    end
    -- A raised cap, limit or rate may free room for lanes parked on e.
    if not erow.missing and (in_flight_limit(erow) > was_limit or rm > was_rm
        or not same_rate) then
      changed[#changed + 1] = e
    end
    if erate > 0 then rates().clamp_clock('e' .. e, erate) end
  end
  count_in('e' .. e, 1)
  count_in('t' .. t, 1)

  if due and due > NOW then
    redis.call('ZADD', K_DELAYED, due, id .. '|' .. t .. '|' .. e .. '|' .. k)
    count_in_row(t, 'd', 1)
    woken = woken + 1 -- a sleeper re-reads when the next delayed delivery is due
  else
    woken = woken + enter(t, e, k, id)
  end
end
write_counts()
if MODE == 'fair' then
  -- A raised cap or a changed rate may free room for lanes parked on that endpoint, and a
  -- tenant asleep for its old rate should re-read the new one now.
  for _, e in ipairs(changed) do woken = woken + fill(e) end
  for _, t in ipairs(retimed) do
    if is_asleep(t) then woken = woken + rates().tenant_wake(t) end
  end
end
wake(woken)
return woken
