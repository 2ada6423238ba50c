-- answered.lua: these leases' requests are over (answered, timed out or refused) and wait
-- for the worker to record them. Their endpoint slots are free from now: a cap bounds the
-- requests open at once, not the bookkeeping behind them. The leases stay until ack or
-- retry_later, so a worker that dies before recording still has them handed out again.
-- ARGV[4..] lease members; a lease already released or answered is left alone.
-- Returns how many slots were freed. Slots are given back once per run of leases on the
-- same endpoint (see ack.lua).
local freed = {}
local count = 0
local run_e, run_n, run_r = nil, 0, 0
local function give_back()
  if run_e then free_slots(run_e, run_n, run_r) end
end
for i = 4, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', K_LEASES, member) and redis.call('SADD', K_ANSWERED, member) == 1 then
    local _, _, e, k = parse_lease(member)
    count = count + 1
    if e ~= run_e then
      give_back()
      run_e, run_n, run_r = e, 0, 0
      if freed[#freed] ~= e then freed[#freed + 1] = e end
    end
    run_n = run_n + 1
    if k == 'r' then run_r = run_r + 1 end
  end
end
give_back()
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif count > 0 and redis.call('EXISTS', K_FIFO) == 1 then
  woken = count
end
wake(woken)
return count
