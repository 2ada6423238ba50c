-- endpoint_state.lua: one endpoint as the schedule holds it, for an operator's or an
-- API's page: ENDPOINT_STATE.endpoint. Returns ENDPOINT_STATE_REPLY; every field false
-- (nil) when the endpoint has nothing in the schedule, so no row.
local e = ARGV[ENDPOINT_STATE.endpoint]
local row = ENDPOINT_ROWS.of(e)
if row.missing then return reply_of(ENDPOINT_STATE_REPLY, {}) end
local values = {
  in_flight = tostring(num(redis.call('ZSCORE', K_BUSY, e))),
  max_in_flight = exact(row.m),
  retry_budget = exact(retry_budget(row)),
  retry_budget_cap = exact(retry_budget_cap(row)),
}
adaptive_values(row, values)
return reply_of(ENDPOINT_STATE_REPLY, values)
