-- set_endpoint.lua: an operator changed an endpoint's caps or rate (SET_ENDPOINT; a rate
-- per second, "" = none). An idle endpoint has no row to change: the next enqueue
-- carries the caps and rate.
local e = ARGV[SET_ENDPOINT.endpoint]
local row = ENDPOINT_ROWS.of(e)
if row.missing then return 0 end
row.m = tonumber(ARGV[SET_ENDPOINT.max_in_flight])
row.rm = tonumber(ARGV[SET_ENDPOINT.retry_max_in_flight])
row.rr = tonumber(ARGV[SET_ENDPOINT.rate]) or 0
set_adaptive(row, ARGV[SET_ENDPOINT.adaptive] == '1')
ENDPOINT_ROWS.changed(e, row)
if row.rr > 0 then rates().clamp_clock('e' .. e, row.rr) end
local woken = 0
-- A raised cap or rate un-parks at once; a lowered rate re-times the wait for a token.
if MODE == 'fair' then woken = fill(e) end
wake(woken)
return woken
