-- pick_fifo.lua: the comparison mode: one arrival-order line for everything. Caps, rates
-- and pauses are honoured naively, as one plain queue would: a delivery whose endpoint is
-- full goes to the back of the line and counts as a deferral; one whose endpoint or tenant
-- has no token ready goes to the back too and counts as a rate wait. Arguments: PICK, as
-- pick_fair.lua (turn size, share and weight are unused).
local worker = ARGV[PICK.worker]
local max_items = tonumber(ARGV[PICK.max_items])
-- The deadline as the text the worker gets back, formatted once: each lease's ZADD then
-- converts no number.
local deadline = string.format('%.6f', NOW + tonumber(ARGV[PICK.lease_seconds]))

promote_due(tonumber(ARGV[PICK.promote_limit]))
reclaim_expired(tonumber(ARGV[PICK.reclaim_limit]))
wake_due(tonumber(ARGV[PICK.wake_limit]))

local out = {}
local deferred, waited = 0, 0
-- Look at each queued delivery at most once per call, and at most a bounded number.
local budget = math.min(redis.call('LLEN', K_FIFO), 4 * max_items + 64)
local whole_line = budget == redis.call('LLEN', K_FIFO)
while #out < max_items and budget > 0 do
  budget = budget - 1
  local entry = redis.call('LPOP', K_FIFO)
  local id, t, e, k = string.match(entry, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
  local free, tok, due, rate, hold = capacity(e, k)
  local trate = TENANT_ROWS.of(t).rr
  local ttok, tdue = HUGE, nil
  if trate > 0 then ttok, tdue = rates().tokens('t' .. t, trate) end
  if free <= 0 then
    redis.call('RPUSH', K_FIFO, entry)
    deferred = deferred + 1
  elseif tok <= 0 or ttok <= 0 then
    redis.call('RPUSH', K_FIFO, entry)
    -- Only so that workers know how long to sleep: FIFO has no lanes to wake.
    if tok <= 0 then redis.call('ZADD', K_DUE, due, 'e' .. e) end
    if ttok <= 0 then redis.call('ZADD', K_DUE, tdue, 't' .. t) end
    live[K_DUE] = true
    waited = waited + 1
  else
    out[#out + 1] = grant(id, t, e, k, deadline, worker)
    if rate > 0 then rates().take('e' .. e, rate, hold) end
    if trate > 0 then rates().take('t' .. t, trate) end
  end
end

flush_grants()
count_stat('deferrals', deferred)
count_stat('rate_waits', waited)
-- Came back short having looked at the whole line: nothing else is ready, say so.
local wait = 0
if #out == 0 or (#out < max_items and whole_line) or redis.call('EXISTS', K_FIFO) == 0 then
  wait = next_event_wait()
end
return reply_of(PICK_REPLY, {
  members = out, deadline = deadline, wait_seconds = string.format('%.6f', wait),
})
