-- answered.lua: these leases' requests are over (answered, timed out or refused) and wait
-- for the worker to record them. Their endpoint slots are free from now: a cap bounds the
-- requests open at once, not the bookkeeping behind them. The leases stay until ack or
-- retry_later, so a worker that dies before recording still has them handed out again.
-- ARGV[4..] lease members; a lease already released or answered is left alone.
-- Returns how many slots were freed.
local freed, seen = {}, {}
local count = 0
for i = 4, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', K_LEASES, member) and redis.call('SADD', K_ANSWERED, member) == 1 then
    local _, _, e, k = parse_lease(member)
    free_slot(e, k)
    count = count + 1
    if not seen[e] then
      seen[e] = true
      freed[#freed + 1] = e
    end
  end
end
local woken = 0
if MODE == 'fair' then
  for _, e in ipairs(freed) do woken = woken + fill(e) end
elseif count > 0 and redis.call('EXISTS', K_FIFO) == 1 then
  woken = count
end
wake(woken)
return count
