-- set_tenant.lua: an operator changed a tenant. ARGV[4] tenant token, [5] weight,
-- [6] "1" paused / "0" active. Returns nothing.
local t = ARGV[4]
local tk = tenant_key(t)
if redis.call('EXISTS', tk) == 1 then redis.call('HSET', tk, 'w', ARGV[5]) end
if ARGV[6] == '1' then
  if redis.call('SADD', K_PAUSED, t) == 1 then
    -- Keep its place: the virtual time it resumes from.
    local score = redis.call('ZSCORE', K_VT, t)
    if score then
      redis.call('HSET', tk, 's', score)
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
elseif redis.call('SREM', K_PAUSED, t) == 1 then
  if has_rotation(t) then
    join(t, tonumber(redis.call('HGET', tk, 's')))
    wake(1)
  end
  redis.call('HDEL', tk, 's')
end
