-- set_endpoint.lua: an operator changed an endpoint's caps or rate. ARGV[4] endpoint,
-- [5] max_in_flight, [6] retry_max_in_flight, [7] rate per second ("" = none). An idle
-- endpoint has no key to change: the next enqueue carries the caps and rate.
local e = ARGV[4]
local ek = endpoint_key(e)
if redis.call('EXISTS', ek) == 0 then return 0 end
redis.call('HSET', ek, 'm', ARGV[5], 'rm', ARGV[6])
local rate = tonumber(ARGV[7])
if rate then
  redis.call('HSET', ek, 'rr', rate)
  rates().clamp_clock('e' .. e, rate)
else
  redis.call('HDEL', ek, 'rr')
end
local woken = 0
-- A raised cap or rate un-parks at once; a lowered rate re-times the wait for a token.
if MODE == 'fair' then woken = fill(e) end
wake(woken)
return woken
