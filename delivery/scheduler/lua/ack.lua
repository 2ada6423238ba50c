-- ack.lua: finished leases (delivered, dead or held): drop each lease, free its slot,
-- and un-park lanes waiting on the endpoint. ARGV[4] outcome (counted, for metrics that
-- must survive worker restarts), ARGV[5..] lease members.
-- Returns the ids whose lease was already lost (expired and reclaimed).
-- A lease's ZREM and SREM say whether it was still held and whether answered.lua freed
-- its slot already, so they stay one per lease. The endpoint's and tenant's counts and
-- slots go down once per run of leases of the same one (a flood's acks are one long
-- run); a
-- table of counts per key would cost more Lua than the commands it saves when every
-- lease is another tenant's.
local lost = {}
local freed = {}
local released = 0
local run_e, run_en, run_t, run_tn = nil, 0, nil, 0
local function endpoint_done()
  if not run_e then return end
  give_back_done() -- before its hash may go: a retry slot's count lives there
  local ek = endpoint_key(run_e)
  if redis.call('HINCRBY', ek, 'n', -run_en) <= 0 then redis.call('DEL', ek) end
end
for i = 5, #ARGV do
  local id, t, e, _, slot_freed = release(ARGV[i])
  if id then
    released = released + 1
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
    if slot_freed and freed[#freed] ~= e then freed[#freed + 1] = e end
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
endpoint_done()
if run_t then tenant_done(run_t, run_tn) end
if released > 0 then count_stat('out:' .. ARGV[4], released) end
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif redis.call('EXISTS', K_FIFO) == 1 then
  woken = #freed
end
wake(woken)
return lost
