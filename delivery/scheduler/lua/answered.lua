-- answered.lua: these leases' requests are over (answered, timed out or refused) and wait
-- for the worker to record them. Their endpoint slots are free from now: a cap bounds the
-- requests open at once, not the bookkeeping behind them. The leases stay until ack or
-- retry_later, so a worker that dies before recording still has them handed out again.
-- ARGV[4..] lease members; a lease already released or answered is left alone.
-- Returns how many slots were freed. Slots are given back once per run of leases on the
-- same endpoint (give_back).
local freed = {}
local count = 0
for i = 4, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', K_LEASES, member) and redis.call('SADD', K_ANSWERED, member) == 1 then
    local _, _, e, k = parse_lease(member)
    count = count + 1
    give_back(e, k)
    if freed[#freed] ~= e then freed[#freed + 1] = e end
  end
end
give_back_done()
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif count > 0 and redis.call('EXISTS', K_FIFO) == 1 then
  woken = count
end
wake(woken)
return count
