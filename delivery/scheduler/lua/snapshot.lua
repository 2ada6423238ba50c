-- snapshot.lua: what operators and metrics read, in one consistent view and a bounded
-- number of operations whatever the number of tenants: counters, the top-N oldest
-- tenants and busiest endpoints, and one ZCOUNT per histogram bucket.
-- SNAPSHOT.top_n, then from SNAPSHOT.bounds on the histogram's bucket bounds in seconds
-- of age.
local top_n = tonumber(ARGV[SNAPSHOT.top_n])
local stats = redis.call(
  'HMGET', K_STATS, 'f', 'r', 'fallback_total', 'deferrals', 'tenants', 'rate_waits')
local fallback_row = TENANT_ROWS.of(FALLBACK)
local fallback = {fallback_row.f, fallback_row.r}
if fallback_row.missing then fallback = {false, false} end

local oldest = ''
if MODE == 'fifo' then
  local head = redis.call('LINDEX', K_FIFO, 0)
  if head then oldest = tostring(ulid_ms(head)) end
else
  local first = redis.call('ZRANGE', K_AGE, 0, 0, 'WITHSCORES')
  if first[2] then oldest = first[2] end
end

local tenants = {}
local aged = redis.call('ZRANGE', K_AGE, 0, top_n - 1, 'WITHSCORES')
local listed, counted = {}, {}
for i = 1, #aged, 2 do
  listed[#listed + 1] = aged[i]
  counted[#counted + 1] = 't' .. aged[i]
end
TENANT_ROWS.read(listed)
local counts = call_list('HMGET', K_COUNT, counted)
for i = 1, #aged, 2 do
  local t = aged[i]
  local tenant = TENANT_ROWS.of(t)
  local rate = ''
  if tenant.rr > 0 then rate = exact(tenant.rr) end
  local paused = 0
  if is_paused(t) then paused = 1 end
  -- Rate-limited: its rate has no token ready now (and it sleeps until the next). A tenant
  -- asleep for want of a retry token is not: its rate is not what holds it.
  local limited = 0
  if tenant.rr > 0 and rates().tokens('t' .. t, tenant.rr) <= 0 then limited = 1 end
  tenants[#tenants + 1] = reply_of(SNAPSHOT_TENANT, {
    tenant = t, oldest_ms = aged[i + 1], fresh = tenant.f, retry = tenant.r, delayed = tenant.d,
    in_flight = num(counts[(i + 1) / 2]) - tenant.f - tenant.r - tenant.d,
    weight = exact(tenant.w), paused = paused, rate = rate, rate_limited = limited,
  })
end

local endpoints = {}
local listed = {}
local function endpoint_row(e, in_flight)
  listed[e] = true
  local row = ENDPOINT_ROWS.of(e)
  local rate = false
  if row.rr > 0 then rate = exact(row.rr) end
  local cfg = {row.m, row.rm, row.ri, rate}
  if row.missing then cfg = {false, false, false, false} end
  local parked = redis.call('ZCARD', park_key(e, 'f')) + redis.call('ZCARD', park_key(e, 'r'))
  local hold = score_of(K_HOLD, e)
  if hold and hold <= NOW then hold = nil end
  local limited = 0
  if rates().tokens('e' .. e, num(cfg[4]), hold) <= 0 then limited = 1 end
  local values = {
    endpoint = e, in_flight = in_flight, max_in_flight = cfg[1],
    retry_max_in_flight = cfg[2], retry_in_flight = cfg[3], parked_lanes = parked,
    rate = cfg[4] or '', paused_until = hold and string.format('%.6f', hold) or '',
    rate_limited = limited,
  }
  if not row.missing then
    values.retry_budget = exact(retry_budget(row))
    adaptive_values(row, values)
  end
  endpoints[#endpoints + 1] = reply_of(SNAPSHOT_ENDPOINT, values)
end
local busiest = redis.call('ZREVRANGE', K_BUSY, 0, top_n - 1, 'WITHSCORES')
for i = 1, #busiest, 2 do endpoint_row(busiest[i], busiest[i + 1]) end
-- Then up to top_n endpoints that a pause or a rate holds back (they may have nothing in
-- flight, so the busiest list would miss them): paused ones first, soonest resuming first.
local extra = 0
local sources = {{K_HOLD, string.format('(%.6f', NOW)}, {K_DUE, '-inf'}}
for _, source in ipairs(sources) do
  local members = redis.call('ZRANGEBYSCORE', source[1], source[2], '+inf', 'LIMIT', 0, top_n)
  for _, member in ipairs(members) do
    local e = member
    if source[1] == K_DUE then e = string.match(member, '^e(.+)$') end
    if e and not listed[e] and extra < top_n then
      extra = extra + 1
      endpoint_row(e, redis.call('ZSCORE', K_BUSY, e) or '0')
    end
  end
end

-- Tenants whose oldest queued delivery is at most `bound` seconds old (cumulative).
local histogram = {}
for i = SNAPSHOT.bounds, #ARGV do
  histogram[#histogram + 1] =
    redis.call('ZCOUNT', K_AGE, NOW_MS - tonumber(ARGV[i]) * 1000, '+inf')
end

return {
  stats, redis.call('ZCARD', K_DELAYED), redis.call('ZCARD', K_LEASES), fallback, oldest,
  tenants, endpoints, histogram, redis.call('ZCARD', K_AGE), tostring(NOW_MS),
}
