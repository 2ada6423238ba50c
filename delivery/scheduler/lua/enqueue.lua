-- enqueue.lua: add a batch of deliveries in one round trip.
-- ARGV[4..] groups of 10: id, tenant token, endpoint, weight, max_in_flight,
-- retry_max_in_flight, kind ("f"/"r"), due (epoch seconds, or "" for now), endpoint rate
-- and tenant rate (requests per second, or "" for none).
-- Weight, caps and rates ride along with every delivery so that the schedule needs no
-- separate configuration store: what the database said at enqueue time wins.
local woken = 0
local changed = {}
local retimed = {}
-- The configuration the previous item applied: an item with the same one (a fan-out, a
-- rebuild's run of one tenant's deliveries) only changes the counts.
local last_t, last_w, last_tr
local last_e, last_m, last_rm, last_er
for i = 4, #ARGV, 10 do
  local id, t, e = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local k, due = ARGV[i + 6], tonumber(ARGV[i + 7])
  local tk = tenant_key(t)
  local ek = endpoint_key(e)

  if not (t == last_t and ARGV[i + 3] == last_w and ARGV[i + 9] == last_tr) then
    last_t, last_w, last_tr = t, ARGV[i + 3], ARGV[i + 9]
    local trate = tonumber(ARGV[i + 9])
    local was = redis.call('HMGET', tk, 'w', 'rr')
    if not was[1] then redis.call('HINCRBY', K_STATS, 'tenants', 1) end
    if trate then
      redis.call('HSET', tk, 'w', ARGV[i + 3], 'rr', trate)
      rates().clamp_clock('t' .. t, trate)
    else
      redis.call('HSET', tk, 'w', ARGV[i + 3])
      if was[2] then redis.call('HDEL', tk, 'rr') end
    end
    if was[2] and tonumber(was[2]) ~= trate then retimed[#retimed + 1] = t end
  end
  if t == FALLBACK then redis.call('HINCRBY', K_STATS, 'fallback_total', 1) end

  if not (e == last_e and ARGV[i + 4] == last_m and ARGV[i + 5] == last_rm
      and ARGV[i + 8] == last_er) then
    last_e, last_m, last_rm, last_er = e, ARGV[i + 4], ARGV[i + 5], ARGV[i + 8]
    local erate = tonumber(ARGV[i + 8])
    local old = redis.call('HMGET', ek, 'm', 'rm', 'rr')
    local m, rm = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
    if old[1] and (m > num(old[1]) or rm > num(old[2]) or tonumber(old[3]) ~= erate) then
      changed[#changed + 1] = e
    end
    if erate then
      redis.call('HSET', ek, 'm', m, 'rm', rm, 'rr', erate)
      rates().clamp_clock('e' .. e, erate)
    else
      redis.call('HSET', ek, 'm', m, 'rm', rm)
      if old[3] then redis.call('HDEL', ek, 'rr') end
    end
  end
  redis.call('HINCRBY', ek, 'n', 1)

  if due and due > NOW then
    redis.call('ZADD', K_DELAYED, due, id .. '|' .. t .. '|' .. e .. '|' .. k)
    redis.call('HINCRBY', tk, 'd', 1)
    woken = woken + 1 -- a sleeper re-reads when the next delayed delivery is due
  else
    woken = woken + enter(t, e, k, id)
  end
end
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
