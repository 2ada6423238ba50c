-- retry_later.lua: the attempt failed; free the slot and hold the delivery in the
-- delayed set until due, when a pick moves it into its tenant's retry lane.
-- ARGV[4] lease member, ARGV[5] due (epoch seconds). Returns 1, or 0 if the lease was lost.
local id, t, e = release(ARGV[4])
if not id then return 0 end
redis.call('ZADD', K_DELAYED, tonumber(ARGV[5]), id .. '|' .. t .. '|' .. e .. '|r')
redis.call('HINCRBY', tenant_key(t), 'd', 1)
count_stat('out:retry', 1)
local woken = 1 -- a sleeper re-reads when the next delayed delivery is due
if MODE == 'fair' then woken = woken + fill(e) end
wake(woken)
return 1
