-- ack.lua: finished leases (delivered, dead or held): drop each lease, free its slot,
-- and un-park lanes waiting on the endpoint. ACK.outcome (counted, for metrics that
-- must survive worker restarts), then the lease members from ACK.members on.
-- Returns the ids whose lease was already lost (expired and reclaimed).
-- Each lease's ZREM says whether it was still held (a lease named twice is held once).
-- Whether answered.lua freed their slots already is read for all of them at once
-- (SMISMEMBER), and they leave the answered set with one SREM (of all of them, answered
-- or not: removing what is not there costs a look-up). The endpoint's and tenant's
-- counts go down once per run of leases of the same one (a flood's acks are one long
-- run), the slots once per endpoint (give_back).
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
local run_e, run_en, run_t, run_tn = nil, 0, nil, 0
local function endpoint_done()
  if not run_e then return end
  give_back_done() -- before its hash may go: a retry slot's count lives there
  local ek = endpoint_key(run_e)
  if redis.call('HINCRBY', ek, 'n', -run_en) <= 0 then redis.call('DEL', ek) end
end
for i, member in ipairs(held) do
  local _, t, e, k = parse_lease(member)
  if e ~= run_e then
    endpoint_done()
    run_e, run_en = e, 0
  end
  run_en = run_en + 1
  if t ~= run_t then
    if run_t then tenant_done(run_t, run_tn) end
    run_t, run_tn = t, 0
  end
  run_tn = run_tn + 1
  if was_answered[i] == 0 then
    give_back(e, k)
    if freed[#freed] ~= e then freed[#freed + 1] = e end
  end
end
endpoint_done()
if run_t then tenant_done(run_t, run_tn) end
if #held > 0 then count_stat('out:' .. ARGV[ACK.outcome], #held) end
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif redis.call('EXISTS', K_FIFO) == 1 then
  woken = #freed
end
wake(woken)
return lost
