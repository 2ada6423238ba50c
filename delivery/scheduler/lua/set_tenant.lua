-- set_tenant.lua: an operator changed a tenant (SET_TENANT: its token, weight, "1" paused
-- or "0" active, rate per second, "" = unlimited). Returns nothing.
local t = ARGV[SET_TENANT.tenant]
local row = TENANT_ROWS.of(t)
local rate = tonumber(ARGV[SET_TENANT.rate]) or 0
local old_rate = rate
-- A tenant with nothing in the schedule has no row to change: its next enqueue carries
-- the weight and rate.
if not row.missing then
  old_rate = row.rr
  row.w, row.rr = tonumber(ARGV[SET_TENANT.weight]), rate
  TENANT_ROWS.changed(t, row)
  if rate > 0 then rates().clamp_clock('t' .. t, rate) end
end
if ARGV[SET_TENANT.paused] == '1' then
  if redis.call('SADD', K_PAUSED, t) == 1 then
    -- Keep its place: the virtual time it resumes from (already kept if it is asleep).
    local score = redis.call('ZSCORE', K_VT, t)
    if score and not row.missing then
      row.s = tonumber(score)
      TENANT_ROWS.changed(t, row)
      redis.call('ZREM', K_VT, t)
    end
    -- Its un-parked lanes may have been the candidates for freed slots; give other
    -- parked lanes on those endpoints the chance instead (bounded).
    local woken = 0
    if MODE == 'fair' then
      for _, k in ipairs({'f', 'r'}) do
        for _, e in ipairs(redis.call('LRANGE', rot_key(t, k), 0, 63)) do
          woken = woken + fill(e)
        end
      end
    end
    wake(woken)
  end
elseif redis.call('SREM', K_PAUSED, t) == 1 and not is_asleep(t) then
  -- (An asleep tenant rejoins when its token is due: tenant_wake reads `s` then.)
  if has_rotation(t) then
    join(t, row.s)
    wake(1)
  end
  if row.s then
    row.s = nil
    TENANT_ROWS.changed(t, row)
  end
end
-- A new rate re-times a tenant asleep for the old one.
if MODE == 'fair' and old_rate ~= rate and is_asleep(t) and rates().tenant_wake(t) > 0 then
  wake(1)
end
