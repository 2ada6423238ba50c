-- pause_endpoint.lua: the endpoint answered 429/503 with Retry-After: no request to it
-- starts before PAUSE_ENDPOINT.paused_until (epoch seconds). Returns 1, or 0 if that
-- has passed already.
-- A pause only ever extends (the later of two wins) and is kept in `hold`, outside the
-- endpoint's row, so it survives an idle spell. Lanes that meet it park until it ends
-- (a pick wakes them then); in-flight requests are not recalled. A rate-limited endpoint
-- then resumes at its rate without a burst: its token clock moves to the pause's end.
local e = ARGV[PAUSE_ENDPOINT.endpoint]
local untl = tonumber(ARGV[PAUSE_ENDPOINT.paused_until])
if untl <= NOW then return 0 end
redis.call('ZADD', K_HOLD, 'GT', untl, e)
local rate = ENDPOINT_ROWS.of(e).rr
if rate > 0 then
  local R = rates()
  redis.call('ZADD', K_TAT, 'GT', R.us(untl) + R.tolerance_us(rate), 'e' .. e)
end
return 1
