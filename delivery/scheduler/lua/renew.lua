-- renew.lua: a live worker extends its leases. ARGV[4] lease seconds, ARGV[5..] members.
-- Returns {ids whose lease was already lost, new deadline}.
local deadline = string.format('%.6f', NOW + tonumber(ARGV[4])) -- formatted once (pick_fair.lua)
local lost = {}
for i = 5, #ARGV do
  if redis.call('ZSCORE', K_LEASES, ARGV[i]) then
    redis.call('ZADD', K_LEASES, 'XX', deadline, ARGV[i])
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
return {lost, deadline}
