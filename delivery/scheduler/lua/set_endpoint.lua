-- set_endpoint.lua: an operator changed an endpoint's caps or rate (SET_ENDPOINT; a rate
-- per second, "" = none). An idle endpoint has no key to change: the next enqueue
-- carries the caps and rate.
local e = ARGV[SET_ENDPOINT.endpoint]
local ek = endpoint_key(e)
if redis.call('EXISTS', ek) == 0 then return 0 end
redis.call(
  'HSET', ek, 'm', ARGV[SET_ENDPOINT.max_in_flight],
  'rm', ARGV[SET_ENDPOINT.retry_max_in_flight])
local rate = tonumber(ARGV[SET_ENDPOINT.rate])
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
