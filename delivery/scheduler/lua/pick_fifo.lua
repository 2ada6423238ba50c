-- pick_fifo.lua: the comparison mode: one arrival-order line for everything. Caps are
-- honoured naively, as in the seed: a capped delivery goes to the back of the line and
-- counts as a deferral. ARGV as pick_fair.lua (turn size, share and weight are unused).
local worker = ARGV[4]
local max_items = tonumber(ARGV[5])
local deadline = NOW + tonumber(ARGV[9])

promote_due(tonumber(ARGV[10]))
reclaim_expired(tonumber(ARGV[11]))

local out = {}
local deferred = 0
-- Look at each queued delivery at most once per call, and at most a bounded number.
local budget = math.min(redis.call('LLEN', K_FIFO), 4 * max_items + 64)
while #out < max_items and budget > 0 do
  budget = budget - 1
  local entry = redis.call('LPOP', K_FIFO)
  local id, t, e, k = string.match(entry, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
  if free_slots(e, k) <= 0 then
    redis.call('RPUSH', K_FIFO, entry)
    deferred = deferred + 1
  else
    out[#out + 1] = grant(id, t, e, k, deadline, worker)
  end
end

if deferred > 0 then redis.call('HINCRBY', K_STATS, 'deferrals', deferred) end
local wait = 0
if #out == 0 or redis.call('EXISTS', K_FIFO) == 0 then wait = next_event_wait() end
return {out, string.format('%.6f', deadline), string.format('%.3f', wait)}
