-- answered.lua: these leases' requests are over (answered, timed out or refused) and wait
-- for the worker to record them. Their endpoint slots are free from now: a cap bounds the
-- requests open at once, not the bookkeeping behind them. The leases stay until ack or
-- retry_later, so a worker that dies before recording still has them handed out again.
-- From ANSWERED.members on: ANSWERED.signals ENDPOINT_ANSWERS groups (how each
-- endpoint's requests went: its adaptive limit moves on them, see adapt in lib.lua),
-- then the lease members; a lease already released or answered is left alone.
-- Returns how many slots were freed. Whether each lease is held and answered already is
-- read for all of them at once (ZMSCORE, SMISMEMBER) and the new ones are added with one
-- SADD: three commands for the leases, however many, and the slots per endpoint
-- (give_back).
local SIGNALS = ANSWERED.members
local FIRST = SIGNALS + tonumber(ARGV[ANSWERED.signals]) * ENDPOINT_ANSWERS.SIZE
local held_at = call_list('ZMSCORE', K_LEASES, ARGV, FIRST)
local was_answered = call_list('SMISMEMBER', K_ANSWERED, ARGV, FIRST)
local fresh = {}
for i = 1, #held_at do
  if held_at[i] and was_answered[i] == 0 then fresh[#fresh + 1] = ARGV[FIRST + i - 1] end
end
if call_many('SADD', K_ANSWERED, fresh) < #fresh then
  -- A lease named twice in one call frees its slot once.
  local seen, once = {}, {}
  for _, member in ipairs(fresh) do
    if not seen[member] then
      seen[member] = true
      once[#once + 1] = member
    end
  end
  fresh = once
end
local freed = {}
for _, member in ipairs(fresh) do
  local _, _, e, k = parse_lease(member)
  give_back(e, k)
  if freed[#freed] ~= e then freed[#freed + 1] = e end
end
give_back_done()
if FIRST > SIGNALS then
  -- Every answering endpoint's row and in-flight count at once.
  local answering, signal_at = {}, {}
  for i = SIGNALS, FIRST - 1, ENDPOINT_ANSWERS.SIZE do
    answering[#answering + 1] = ARGV[i + ENDPOINT_ANSWERS.endpoint]
    signal_at[#signal_at + 1] = i
  end
  ENDPOINT_ROWS.read(answering)
  local busy = call_list('ZMSCORE', K_BUSY, answering)
  for n, i in ipairs(signal_at) do
    local e = answering[n]
    local row = ENDPOINT_ROWS.of(e)
    if row.al > 0 then
      local ok = tonumber(ARGV[i + ENDPOINT_ANSWERS.ok])
      local overloaded = tonumber(ARGV[i + ENDPOINT_ANSWERS.overloaded])
      local latency_ms = tonumber(ARGV[i + ENDPOINT_ANSWERS.latency_ms])
      -- A raised limit is a freed slot too: lanes parked on e may go now.
      local raised = adapt(row, ok, overloaded, latency_ms, num(busy[n]))
      if raised and freed[#freed] ~= e then freed[#freed + 1] = e end
      ENDPOINT_ROWS.changed(e, row)
    end
  end
end
local woken = 0
if MODE == 'fair' then
  woken = fill_each(freed)
elseif #fresh > 0 and redis.call('EXISTS', K_FIFO) == 1 then
  woken = #fresh
end
wake(woken)
return #fresh
