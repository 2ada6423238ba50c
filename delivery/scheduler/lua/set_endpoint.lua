-- set_endpoint.lua: an operator changed an endpoint's caps. ARGV[4] endpoint,
-- [5] max_in_flight, [6] retry_max_in_flight. An idle endpoint has no key to change:
-- the next enqueue carries the caps.
local e = ARGV[4]
local ek = endpoint_key(e)
if redis.call('EXISTS', ek) == 0 then return 0 end
redis.call('HSET', ek, 'm', ARGV[5], 'rm', ARGV[6])
local woken = 0
if MODE == 'fair' then woken = fill(e) end
wake(woken)
return woken
