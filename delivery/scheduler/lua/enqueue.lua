-- enqueue.lua: add a batch of deliveries in one round trip.
-- ARGV[4..] groups of 8: id, tenant token, endpoint, weight, max_in_flight,
-- retry_max_in_flight, kind ("f"/"r"), due (epoch seconds, or "" for now).
-- Weight and caps ride along with every delivery so that the schedule needs no separate
-- configuration store: what the database said at enqueue time wins.
local woken = 0
local raised = {}
for i = 4, #ARGV, 8 do
  local id, t, e = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local k, due = ARGV[i + 6], tonumber(ARGV[i + 7])

  local tk = tenant_key(t)
  if redis.call('EXISTS', tk) == 0 then redis.call('HINCRBY', K_STATS, 'tenants', 1) end
  redis.call('HSET', tk, 'w', ARGV[i + 3])
  if t == FALLBACK then redis.call('HINCRBY', K_STATS, 'fallback_total', 1) end

  local ek = endpoint_key(e)
  local old = redis.call('HMGET', ek, 'm', 'rm')
  local m, rm = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
  if old[1] and (m > num(old[1]) or rm > num(old[2])) then raised[#raised + 1] = e end
  redis.call('HSET', ek, 'm', m, 'rm', rm)
  redis.call('HINCRBY', ek, 'n', 1)

  if due and due > NOW then
    redis.call('ZADD', K_DELAYED, due, id .. '|' .. t .. '|' .. e .. '|' .. k)
    redis.call('HINCRBY', tk, 'd', 1)
    woken = woken + 1 -- a sleeper re-reads when the next delayed delivery is due
  else
    woken = woken + enter(t, e, k, id)
  end
end
-- A raised cap is a freed slot for lanes parked on that endpoint.
if MODE == 'fair' then
  for _, e in ipairs(raised) do woken = woken + fill(e) end
end
wake(woken)
return woken
