-- ack.lua: finished leases (delivered, dead or held): drop each lease, free its slot,
-- and un-park lanes waiting on the endpoint. ARGV[4] outcome (counted, for metrics that
-- must survive worker restarts), ARGV[5..] lease members.
-- Returns the ids whose lease was already lost (expired and reclaimed).
local lost = {}
local freed = {}
local released = 0
for i = 5, #ARGV do
  local id, t, e, _, slot_freed = release(ARGV[i])
  if id then
    released = released + 1
    local ek = endpoint_key(e)
    if redis.call('HINCRBY', ek, 'n', -1) <= 0 then
      redis.call('DEL', ek)
    elseif slot_freed then
      freed[#freed + 1] = e
    end
    tenant_done(t)
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
if released > 0 then count_stat('out:' .. ARGV[4], released) end
local woken = 0
if MODE == 'fair' then
  for _, e in ipairs(freed) do woken = woken + fill(e) end
elseif redis.call('EXISTS', K_FIFO) == 1 then
  woken = #freed
end
wake(woken)
return lost
