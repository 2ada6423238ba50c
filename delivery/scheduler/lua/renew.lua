-- renew.lua: a live worker extends its leases. ARGV[4] lease seconds, ARGV[5..] members.
-- Returns {ids whose lease was already lost, new deadline}.
local deadline = NOW + tonumber(ARGV[4])
local lost = {}
for i = 5, #ARGV do
  if redis.call('ZSCORE', K_LEASES, ARGV[i]) then
    redis.call('ZADD', K_LEASES, 'XX', deadline, ARGV[i])
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
return {lost, string.format('%.6f', deadline)}
