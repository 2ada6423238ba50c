-- snapshot.lua: what operators and metrics read, in one consistent view and a bounded
-- number of operations whatever the number of tenants: counters, the top-N oldest
-- tenants and busiest endpoints, and one ZCOUNT per histogram bucket.
-- ARGV[4] top_n, ARGV[5..] histogram bucket bounds in seconds of age.
local top_n = tonumber(ARGV[4])
local stats = redis.call('HMGET', K_STATS, 'f', 'r', 'fallback_total', 'deferrals', 'tenants')
local fallback = redis.call('HMGET', tenant_key(FALLBACK), 'f', 'r')

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
for i = 1, #aged, 2 do
  local t = aged[i]
  local row = redis.call('HMGET', tenant_key(t), 'f', 'r', 'd', 'i', 'w')
  local paused = 0
  if is_paused(t) then paused = 1 end
  tenants[#tenants + 1] = {t, aged[i + 1], row[1], row[2], row[3], row[4], row[5], paused}
end

local endpoints = {}
local busiest = redis.call('ZREVRANGE', K_BUSY, 0, top_n - 1, 'WITHSCORES')
for i = 1, #busiest, 2 do
  local e = busiest[i]
  local cfg = redis.call('HMGET', endpoint_key(e), 'm', 'rm', 'ri')
  local parked = redis.call('ZCARD', park_key(e, 'f')) + redis.call('ZCARD', park_key(e, 'r'))
  endpoints[#endpoints + 1] = {e, busiest[i + 1], cfg[1], cfg[2], cfg[3], parked}
end

-- Tenants whose oldest queued delivery is at most `bound` seconds old (cumulative).
local histogram = {}
for i = 5, #ARGV do
  histogram[#histogram + 1] =
    redis.call('ZCOUNT', K_AGE, NOW_MS - tonumber(ARGV[i]) * 1000, '+inf')
end

return {
  stats, redis.call('ZCARD', K_DELAYED), redis.call('ZCARD', K_LEASES), fallback, oldest,
  tenants, endpoints, histogram, redis.call('ZCARD', K_AGE), tostring(NOW_MS),
}
