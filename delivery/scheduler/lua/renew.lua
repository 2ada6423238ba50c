-- renew.lua: a live worker extends its leases by RENEW.lease_seconds; the members from
-- RENEW.members on. Returns RENEW_REPLY: the ids whose lease was already lost, the new
-- deadline.
local deadline = string.format('%.6f', NOW + tonumber(ARGV[RENEW.lease_seconds])) -- formatted once (pick_fair.lua)
local lost = {}
for i = RENEW.members, #ARGV do
  if redis.call('ZSCORE', K_LEASES, ARGV[i]) then
    redis.call('ZADD', K_LEASES, 'XX', deadline, ARGV[i])
  else
    lost[#lost + 1] = string.match(ARGV[i], '^[^|]+')
  end
end
return reply_of(RENEW_REPLY, {lost = lost, deadline = deadline})
