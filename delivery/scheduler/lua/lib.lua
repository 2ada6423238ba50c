-- lib.lua: the data-structure rules every scheduler script shares. scripts.py prepends
-- this file to each script, so each script stays one atomic unit (no other client can
-- interleave) without each one restating the rules.
--
-- Calling convention. KEYS[1] is the stats hash: declared so Redis Cluster routes the
-- call to the shard's slot; every other key carries the same {shard} hash tag, so one
-- script touches one slot. Arguments are read by name from the tables protocol.py writes
-- before this file (CALL, ITEM, PICK, ...): CALL.prefix the key prefix "wh:{<shard>}:",
-- CALL.now now in epoch seconds (negative: read the Redis clock, so all workers share one
-- clock), CALL.mode "fair" or "fifo"; each script's own come after them.
--
-- Names: t = tenant token (decimal id, "fb" for the fallback lane), e = endpoint id,
-- k = lane kind ("f" fresh, "r" retry). Keys after the prefix:
--   q:t:e:k     LIST  one lane: delivery ids, oldest first
--   rot:t:k     LIST  the tenant's rotation of endpoints whose k-lane may be dispatched
--   park:e:k    ZSET  tenants whose k-lane to e waits for a slot, by virtual time
--   parked      SET   endpoints that may have parked lanes: every endpoint with a park set,
--                     and some whose park sets emptied since (removed when a freed slot
--                     finds them empty), so that freeing slots reads one SMISMEMBER for all
--                     its endpoints rather than an EXISTS each
--   vt          ZSET  unpaused tenants with a lane in a rotation, by virtual time of next turn
--   head:t      ZSET  the tenant's non-empty lanes ("e:k"), by enqueue ms of their head
--   age         ZSET  tenants with queued work, by enqueue ms of their oldest queued delivery
--   tenants     HASH  t -> the tenant's row, ten doubles (struct "<dddddddddd"): w weight,
--                     rr rate per second (0 = unlimited), f r d fresh/retry queued and
--                     delayed counts, c retry credit (ppm), u used part of an unfinished
--                     turn, s virtual time kept while paused or asleep for its rate or
--                     its retry budget (-1 = none), its retry budget's tokens (bt) as they
--                     were at bs (epoch s; 0 = a full budget). One field per tenant, so a
--                     call reads the rows of the tenants it meets with one HMGET and
--                     writes them with one HSET (row_store)
--   endpoints   HASH  e -> the endpoint's row, twelve doubles (struct "<dddddddddddd"):
--                     m rm caps, ri live retry leases, rr rate per second (0 = unlimited);
--                     the adaptive limit (al, 0 = none: m alone bounds it), its answers'
--                     recent and baseline latency in ms (lf, lb), when it last went down
--                     (lt, epoch s; 0 = never, so it still grows as in a slow start), from
--                     what (lp) and why (lw: the recent latency in ms that was too slow,
--                     or -1 for an overload); its retry budget's tokens (bt) as they were
--                     at bs (epoch s; 0 = a full budget)
--   count       HASH  "t<t>" / "e<e>": the tenant's or endpoint's deliveries anywhere in
--                     the schedule (queued, delayed or leased; a tenant's in flight is
--                     count - f - r - d). Its row goes when this reaches 0. One hash for
--                     all, so a call reads and writes every count it changes with one
--                     HMGET and one HSET, however many tenants and endpoints
--   busy        ZSET  endpoints by number of live leases not yet answered (in flight)
--   leases      ZSET  "id|t|e|k|token" by deadline
--   answered    SET   leases whose request is over but not yet recorded: their endpoint
--                     slot is free already (busy and ri no longer count them)
--   delayed     ZSET  "id|t|e|k" by due time
--   fifo        LIST  "id|t|e|k" (FIFO mode only)
--   paused      SET   paused tenants (configuration, so it outlives an idle spell)
--   tat         ZSET  token clocks: "e<e>" / "t<t>" by theoretical arrival time (GCRA);
--                     only while in the future (older ones are pruned: same as none)
--   due         ZSET  what a rate or pause put to sleep, by when its next token is due:
--                     "e<e>" (lanes parked on e wait for a token), "t<t>" (tenant out of vt)
--   hold        ZSET  endpoints paused by Retry-After, by paused-until (for the snapshot)
--   stats       HASH  f r (depths), V (virtual time), seq, deferrals, rate_waits,
--                     fallback_total, tenants, out:<outcome> (finished leases by outcome)
--   wake        LIST  wake-up tokens for sleeping workers (short expiry)
-- Invariant: a non-empty lane is in exactly one place, its tenant's rotation or its
-- endpoint's park set (waiting for a slot or a token); a tenant is in vt exactly when it
-- is unpaused, has a rotation and is not asleep for its rate ("t<t>" in due).
-- Empty lists/sets vanish by themselves and rows and counts are deleted at zero, so an idle
-- tenant or endpoint leaves no key behind.

-- A call's own state. Each is set by begin(), at the start of every call: under EVAL this
-- file's top level runs per call anyway, but a Redis Function library's top level runs
-- once, at FUNCTION LOAD, so nothing a call leaves here may reach the next one.
local P, NOW, NOW_MS, MODE -- key prefix, now (epoch s), now in ms, "fair" or "fifo"
local FALLBACK = 'fb'
local PPM = 1000000 -- retry credit is kept in integer parts per million: no float drift
local MAX_WAIT = 5 -- seconds a worker may sleep without re-checking
-- The tokens of an endpoint or tenant without a rate: math.huge, but no global (math) can
-- be read while FUNCTION LOAD runs this file's top level.
local HUGE = 1 / 0
local EPS = 1e-6 -- seconds: a double holds epoch seconds (~1.8e9) to a fraction of this

local K_STATS, K_VT, K_AGE, K_BUSY, K_LEASES, K_ANSWERED, K_DELAYED
local K_FIFO, K_PAUSED, K_WAKE, K_TAT, K_DUE, K_HOLD, K_COUNT, K_PARKED, K_TENANTS
local K_ENDPOINTS

local function lane_key(t, e, k) return P .. 'q:' .. t .. ':' .. e .. ':' .. k end
local function rot_key(t, k) return P .. 'rot:' .. t .. ':' .. k end
local function park_key(e, k) return P .. 'park:' .. e .. ':' .. k end
local function head_key(t) return P .. 'head:' .. t end

local function num(value) return tonumber(value) or 0 end
-- An integer as a command's argument. A Lua number given to redis.call is formatted with
-- "%.17g" (a slow path of printf on Redis 7.0); '%d' is an integer's fast one, and a
-- constant argument is best a string literal ('0'), which costs nothing.
local function int(x) return string.format('%d', x) end

-- A command over any number of values, in chunks: Lua's unpack() is bounded (~8,000
-- values), and a caller may hand over any number of leases. `key` leads each chunk (nil:
-- the values are keys themselves, as for EXISTS); CHUNK is even, so score-member pairs
-- stay whole. Returns the sum of the integer replies. No values: no command.
local CHUNK = 1000
local function call_many(command, key, values)
  local total = 0
  for first = 1, #values, CHUNK do
    local last = math.min(first + CHUNK - 1, #values)
    local got
    if key then
      got = redis.call(command, key, unpack(values, first, last))
    else
      got = redis.call(command, unpack(values, first, last))
    end
    if type(got) == 'number' then total = total + got end
  end
  return total
end

-- call_many for a command whose reply is a list, one value per value sent (ZMSCORE,
-- SMISMEMBER): the chunks' replies, joined (one chunk's as it came).
local function call_list(command, key, values, first_value)
  first_value = first_value or 1
  if #values - first_value < CHUNK then
    if #values < first_value then return {} end
    return redis.call(command, key, unpack(values, first_value))
  end
  local out = {}
  for first = first_value, #values, CHUNK do
    local last = math.min(first + CHUNK - 1, #values)
    local got = redis.call(command, key, unpack(values, first, last))
    for _, value in ipairs(got) do out[#out + 1] = value end
  end
  return out
end

-- New scores for some of a ZSET's members, at once: one ZREM of those whose score is
-- false (they leave) and one ZADD of the others.
local function write_scores(key, members, scores)
  local adds, gone = {}, {}
  for _, member in ipairs(members) do
    local score = scores[member]
    if score then
      adds[#adds + 1] = score
      adds[#adds + 1] = member
    else
      gone[#gone + 1] = member
    end
  end
  call_many('ZREM', key, gone)
  call_many('ZADD', key, adds)
end

-- Values by key, in the order keys first came (so what a script does with them next is
-- the same on every run).
local function tally()
  return {order = {}, by = {}}
end

-- A number as text that reads back as the same number: counts as integers, the rest
-- (a rate, a virtual time) with every digit a double holds.
local function exact(x)
  if x % 1 == 0 and x < 1e14 and x > -1e14 then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- Rows of tenants and endpoints, one field each in one hash (`tenants`, `endpoints`),
-- packed: a call reads the rows of everyone it meets with one HMGET (read) or an HGET
-- each (of), changes them in Lua, and writes every changed one back with one HSET when
-- it ends (write, from finish). `decode(packed or false)` makes a row (`missing` when
-- there was none), `encode(row)` its packed value.
local function row_store(decode, encode)
  local store = {}
  -- reset() at the start of every call; the tables are made on first use, so a call that
  -- meets no row makes none.
  local rows, changed_ids, key
  function store.reset(hash_key) rows, changed_ids, key = nil, nil, hash_key end
  function store.of(id)
    if not rows then rows = {} end
    local row = rows[id]
    if row == nil then
      row = decode(redis.call('HGET', key, id))
      rows[id] = row
    end
    return row
  end
  -- The packed rows of those of `ids` not read yet (one HMGET): the ids, their rows.
  local function fetch(ids)
    if not rows then rows = {} end
    local wanted, seen = {}, {}
    for _, id in ipairs(ids) do
      if rows[id] == nil and not seen[id] then
        seen[id] = true
        wanted[#wanted + 1] = id
      end
    end
    return wanted, call_list('HMGET', key, wanted)
  end
  function store.read(ids)
    if #ids == 1 then
      store.of(ids[1])
      return
    end
    local wanted, got = fetch(ids)
    for i, id in ipairs(wanted) do rows[id] = decode(got[i]) end
  end
  -- Of `ids`, those whose row is worth a look, in order: a row this call read already,
  -- or one of the others (read with one HMGET) unless `idle(packed)` says nothing about
  -- it can change. Those are not decoded: a call that changes few rows of many pays a
  -- look at a few bytes of the rest.
  function store.read_unless(ids, idle)
    local wanted, got = fetch(ids)
    for i, id in ipairs(wanted) do
      if not idle(got[i]) then rows[id] = decode(got[i]) end
    end
    local out = {}
    for _, id in ipairs(ids) do
      if rows[id] ~= nil then out[#out + 1] = id end
    end
    return out
  end
  function store.changed(id, row)
    if not row.changed then
      row.changed = true
      if not changed_ids then changed_ids = {} end
      changed_ids[#changed_ids + 1] = id
    end
  end
  function store.write()
    if not changed_ids then return end
    local out = {}
    for _, id in ipairs(changed_ids) do
      local row = rows[id]
      if row and row.changed then
        out[#out + 1] = id
        out[#out + 1] = encode(row)
        row.changed, row.missing = false, false
      end
    end
    changed_ids = nil
    call_many('HSET', key, out)
  end
  -- Rows of those with nothing left anywhere in the schedule go. Returns how many did.
  function store.drop(ids)
    if rows then
      for _, id in ipairs(ids) do rows[id] = nil end
    end
    return call_many('HDEL', key, ids)
  end
  return store
end

-- Rows are packed with Redis's `struct` library, as little-endian doubles: decoding one
-- is a C call, not a pattern match and a tonumber per field, several times cheaper
-- (docs/SCHEDULER.md, "Redis work per delivery"). A value a row may lack (a tenant's
-- saved virtual time) is -1 there. A budget's `bs` stays each row's last double:
-- budget_full reads it without decoding the row.
-- A tenant's row: w, rr, f, r, d, c, u, s, bt, bs (see `tenants` above).
local TENANT_ROWS = row_store(function(packed)
  if not packed then
    return {
      w = 0, rr = 0, f = 0, r = 0, d = 0, c = 0, u = 0, s = nil, bt = 0, bs = 0,
      missing = true,
    }
  end
  local w, rr, f, r, d, c, u, s, bt, bs = struct.unpack('<dddddddddd', packed)
  if s < 0 then s = nil end
  return {w = w, rr = rr, f = f, r = r, d = d, c = c, u = u, s = s, bt = bt, bs = bs}
end, function(row)
  return struct.pack(
    '<dddddddddd', row.w, row.rr, row.f, row.r, row.d, row.c, row.u, row.s or -1, row.bt,
    row.bs)
end)

-- An endpoint's row: m, rm, ri, rr, al, lf, lb, lt, lp, lw, bt, bs (see `endpoints`
-- above).
local ENDPOINT_ROWS = row_store(function(packed)
  if not packed then
    return {
      m = 0, rm = 0, ri = 0, rr = 0, al = 0, lf = 0, lb = 0, lt = 0, lp = 0, lw = 0, bt = 0,
      bs = 0, missing = true,
    }
  end
  local m, rm, ri, rr, al, lf, lb, lt, lp, lw, bt, bs =
    struct.unpack('<dddddddddddd', packed)
  return {
    m = m, rm = rm, ri = ri, rr = rr, al = al, lf = lf, lb = lb, lt = lt, lp = lp, lw = lw,
    bt = bt, bs = bs,
  }
end, function(row)
  return struct.pack(
    '<dddddddddddd', row.m, row.rm, row.ri, row.rr, row.al, row.lf, row.lb, row.lt, row.lp,
    row.lw, row.bt, row.bs)
end)

-- The requests an endpoint may have open at once: its cap, or under it its adaptive
-- limit (whole requests, at least one).
local function in_flight_limit(row)
  if row.al > 0 and row.al < row.m then return math.floor(row.al) end
  return row.m
end

-- Adaptive limits (docs/SCHEDULER.md, "Adaptive limits"). A new or rebuilt limit starts
-- low, at ADAPTIVE_START, and grows like a slow start: by one per answer that was neither
-- slow nor an overload, doubling per round trip, until the first time it went down. From
-- then on it grows by one per round trip's worth of answers (1/limit each). It backs off
-- at most once per round trip: to LIMIT_BACKOFF of itself on an overload answer, and in
-- proportion when the answers' recent latency passes LATENCY_TOLERANCE times its
-- baseline and LATENCY_SLACK_MS more than it (never by more than the backoff); an overload later in the same round trip
-- holds it at the requests still open. It grows only while in use (at least half its
-- requests open), and stays between 1 and the cap.
local ADAPTIVE_START = 4
local LIMIT_BACKOFF = 0.5
local LATENCY_TOLERANCE = 1.5
-- ...and by at least this many milliseconds. An endpoint that answers in a millisecond
-- reads a few more whenever our own workers are busy (the time an answer waits for the
-- event loop counts), and 1.5 times a millisecond would back its limit off on our
-- queueing rather than its own (a fast gateway endpoint's flood slowed down so).
local LATENCY_SLACK_MS = 25
-- Each answer moves the recent latency this share of the way to its own. The baseline
-- is the lowest the recent latency has been, not the lowest answer: an endpoint whose
-- answers are fast and slow by turns (a fast path and a slow one, or a stall of its
-- network stack) would otherwise read as slow forever against its fast ones. It takes a
-- lower recent latency at once, and a higher one only while one request at a time is
-- allowed, where no queue of ours can be in it: a baseline that drifted up with the
-- latency it allows would let the limit climb past the capacity step by step.
local RECENT_WEIGHT = 0.2
-- The shortest round trip a backoff waits for (seconds): answers that were all overloads
-- carry no latency to go by.
local MIN_ROUND_TRIP = 0.05

-- Whether e's limit adapts, from the configuration an enqueue or an operator gave: a
-- limit turned on starts low; one turned off is forgotten.
local function set_adaptive(row, adaptive)
  if not adaptive then
    row.al, row.lf, row.lb, row.lt, row.lp, row.lw = 0, 0, 0, 0, 0, 0
  elseif row.al <= 0 then
    row.al = math.min(ADAPTIVE_START, math.max(row.m, 1))
  elseif row.al > row.m then
    row.al = math.max(row.m, 1)
  end
end

-- One call's answers from e: `ok` answers that took `latency_ms` in all, `overloaded`
-- that said it was past its capacity; `still_open`, its requests open after them.
-- Returns whether the limit went up.
local function adapt(row, ok, overloaded, latency_ms, still_open)
  if row.al <= 0 then return false end
  local limit, rtt = row.al, row.lf
  if ok > 0 then
    local mean = latency_ms / ok
    if row.lf <= 0 then row.lf = mean end
    row.lf = row.lf + (mean - row.lf) * math.min(1, ok * RECENT_WEIGHT)
    if row.lb <= 0 or row.lf < row.lb or limit < 2 then row.lb = row.lf end
    rtt = math.max(rtt, row.lf)
  end
  local ceiling = math.max(row.m, 1)
  local slow_past = math.max(row.lb * LATENCY_TOLERANCE, row.lb + LATENCY_SLACK_MS)
  local slow = row.lb > 0 and row.lf > slow_past
  if overloaded > 0 or slow then
    -- Once per round trip: the answers of one window all say the same. But an overload
    -- within it (a 503 comes back at once, and its freed slot would be filled at once)
    -- holds the limit at the requests still open: none more into the wall until some end.
    if NOW - row.lt < math.max(rtt / 1000, MIN_ROUND_TRIP) then
      if overloaded > 0 then
        row.al = math.max(1, math.min(limit, still_open))
      end
      return false
    end
    local factor, why = LIMIT_BACKOFF, -1
    if overloaded == 0 then
      factor = math.max(LIMIT_BACKOFF, slow_past / row.lf)
      why = row.lf
    end
    row.lp, row.lw = math.min(limit, ceiling), why
    row.al, row.lt = math.max(1, row.lp * factor), NOW
    return false
  end
  if ok == 0 or (still_open + ok + overloaded) * 2 < limit then return false end
  if row.lt == 0 then
    row.al = math.min(ceiling, limit + ok)
  else
    row.al = math.min(ceiling, limit + ok / limit)
  end
  return row.al > limit
end

-- Retry budgets (docs/SCHEDULER.md, "Retry budgets"). Each retry an endpoint is sent
-- takes a token from its budget; every delivery it accepts earns RETRY_BUDGET_SHARE of
-- one, and an accepted retry its own token back as well; the budget also refills by
-- RETRY_BUDGET_FLOOR a second, and holds at most twice the endpoint's in-flight limit (a
-- token comes back when its retry is recorded, after the answer freed its slot: twice
-- lets retries fill every slot while the last ones are being recorded). So the
-- retries that fail are at most that share of what it accepted plus the floor, while
-- retries that succeed go on at the pace of its limit: after an outage the backlog comes
-- back growing by the share per round trip, not in one wave. A retry lane out of tokens
-- waits as for a rate's token (no lease, no attempt), and fresh lanes go on.
local RETRY_BUDGET_SHARE = 0.2
local RETRY_BUDGET_FLOOR = 1 -- tokens per second

-- A tenant's retries have a budget of their own, over all its endpoints: TENANT_RETRY_FLOOR
-- tokens a second, at most TENANT_RETRY_CAP, and an accepted retry's token back (no
-- share of fresh deliveries: that would cost every ack a read of its tenants' rows). So a
-- tenant's failing retries stay under the floor however many of its endpoints fail, and
-- its succeeding ones pace themselves. Out of tokens with only retries to send, the
-- tenant sleeps as for its rate (tenant_sleep) until the next token; with fresh work too,
-- its turns go to the fresh lanes.
local TENANT_RETRY_FLOOR = 10 -- tokens per second
local TENANT_RETRY_CAP = 200

-- The tokens a budget (`bt` as of `bs` in `row`; bs 0: full) holds now (fractional).
local function budget_tokens(row, cap, floor)
  if row.bs <= 0 then return cap end
  local tokens = row.bt + (NOW - row.bs) * floor
  if tokens > cap then return cap end
  return tokens
end

-- Add `by` tokens (a retry sent: -1). A budget that is full and stays so is left as it is
-- (a row that is not written). Returns whether the row changed.
local function change_budget(row, by, cap, floor)
  if row.bs <= 0 and by >= 0 then return false end
  local tokens = budget_tokens(row, cap, floor) + by
  if tokens >= cap then
    row.bt, row.bs = 0, 0
  else
    row.bt, row.bs = tokens, NOW
  end
  return true
end

-- A packed tenant's or endpoint's row whose budget is full (its `bs`, the row's last
-- double, 0), or no row: adding tokens changes nothing, so it need not be decoded.
local FULL_BUDGET = '\0\0\0\0\0\0\0\0' -- 0 as a little-endian double
local function budget_full(packed)
  return not packed or string.sub(packed, -8) == FULL_BUDGET
end

-- When a budget holding `tokens` has its next whole one.
local function budget_due(tokens, floor)
  return NOW + (math.floor(tokens) + 1 - tokens) / floor
end

local function retry_budget_cap(row) return 2 * math.max(1, in_flight_limit(row)) end
-- The tokens e's budget holds now.
local function retry_budget(row)
  return budget_tokens(row, retry_budget_cap(row), RETRY_BUDGET_FLOOR)
end

-- An adaptive endpoint's limit and why it last moved, under the names ENDPOINT_STATE_REPLY
-- and SNAPSHOT_ENDPOINT share; nothing while its limit is its cap alone.
local function adaptive_values(row, values)
  if row.al <= 0 then return end
  values.adaptive_limit = exact(row.al)
  values.latency_ms = exact(row.lf)
  values.baseline_ms = exact(row.lb)
  if row.lt > 0 then
    values.backed_off_at = exact(row.lt)
    values.backed_off_from = exact(row.lp)
    if row.lw > 0 then values.backed_off_latency_ms = exact(row.lw) end
  end
end

local function change_retry_budget(row, by)
  return change_budget(row, by, retry_budget_cap(row), RETRY_BUDGET_FLOOR)
end
local function retry_budget_due(tokens) return budget_due(tokens, RETRY_BUDGET_FLOOR) end

-- The same for a tenant's row.
local function tenant_retry_budget(row)
  return budget_tokens(row, TENANT_RETRY_CAP, TENANT_RETRY_FLOOR)
end
local function change_tenant_retry_budget(row, by)
  return change_budget(row, by, TENANT_RETRY_CAP, TENANT_RETRY_FLOOR)
end
local function tenant_retry_budget_due(tokens) return budget_due(tokens, TENANT_RETRY_FLOOR) end

-- A ULID's first 10 Crockford base32 characters are its creation time in ms: the age of
-- a lane's head costs no lookup.
local B32 = nil -- built on first use: most acks never read a ULID
local function ulid_ms(id)
  if not B32 then
    B32 = {}
    local alphabet = '0123456789ABCDEFGHJKMNPQRSTVWXYZ'
    for i = 1, 32 do
      B32[string.byte(alphabet, i)] = i - 1
      B32[string.byte(string.lower(alphabet), i)] = i - 1
    end
  end
  -- One string.byte for all ten, unrolled: a C call per character costs more than the
  -- arithmetic. (An id shorter than ten reads B32[nil], which is nil: 0, as for any
  -- character outside the alphabet.)
  local c1, c2, c3, c4, c5, c6, c7, c8, c9, c10 = string.byte(id, 1, 10)
  local b = B32
  local high = (((b[c1] or 0) * 32 + (b[c2] or 0)) * 32 + (b[c3] or 0)) * 32 + (b[c4] or 0)
  local low = (((b[c6] or 0) * 32 + (b[c7] or 0)) * 32 + (b[c8] or 0)) * 32 + (b[c9] or 0)
  return ((high * 32 + (b[c5] or 0)) * 1048576 + low) * 32 + (b[c10] or 0)
end

-- Ages are kept in steps of 1024 milliseconds, a ULID's first eight characters: a lane's
-- head score and its tenant's age change only when a pop moves the head into a later
-- step. Each score is then at most one step older than the head it stands for, never
-- younger (docs/SCHEDULER.md, "Ages in steps"), and a backlog whose deliveries came in
-- close together (a burst, a flood) pops without touching the age sets.
local function same_age_step(a, b) return string.sub(a, 1, 8) == string.sub(b, 1, 8) end

local function vtime() return num(redis.call('HGET', K_STATS, 'V')) end

-- The stats hash's counters, written back once at the end of the script (scripts.py
-- calls flush_stats after each script's body): a pick or an enqueue of n deliveries then
-- writes the shard's depths, lease sequence and totals with two commands, not 2n. No
-- script reads these counters back, except `seq` (see next_seq).
local STATS_BY, STATS_SET -- begin() empties them
local function count_stat(field, by) STATS_BY[field] = (STATS_BY[field] or 0) + by end
local SEQ -- begin() forgets it
local function next_seq()
  if not SEQ then SEQ = num(redis.call('HGET', K_STATS, 'seq')) end
  SEQ = SEQ + 1
  count_stat('seq', 1)
  return SEQ
end
local function flush_stats()
  local fields = {}
  for field, by in pairs(STATS_BY) do
    if by ~= 0 then fields[#fields + 1] = field end
  end
  if #fields == 1 and next(STATS_SET) == nil then
    redis.call('HINCRBY', K_STATS, fields[1], int(STATS_BY[fields[1]]))
    return
  end
  local pairs_out = {}
  if #fields > 0 then
    local was = redis.call('HMGET', K_STATS, unpack(fields))
    for i, field in ipairs(fields) do
      pairs_out[#pairs_out + 1] = field
      pairs_out[#pairs_out + 1] = int(num(was[i]) + STATS_BY[field])
    end
  end
  for field, value in pairs(STATS_SET) do
    pairs_out[#pairs_out + 1] = field
    pairs_out[#pairs_out + 1] = value
  end
  if #pairs_out > 0 then redis.call('HSET', K_STATS, unpack(pairs_out)) end
end
local function is_paused(t) return redis.call('SISMEMBER', K_PAUSED, t) == 1 end

-- ZSCORE on the rate keys (tat, hold, due), but whether each exists is read once per
-- script (writers set it, deleters clear it): without rates or pauses, a script pays at
-- most one EXISTS per key, and a pick none after its upkeep's one EXISTS of all three.
local live -- begin() empties it
local function score_of(key, member)
  if live[key] == nil then live[key] = redis.call('EXISTS', key) == 1 end
  if not live[key] then return nil end
  return tonumber(redis.call('ZSCORE', key, member))
end

-- Out of tokens: the tenant left vt until its next token is due (see tenant_sleep).
local function is_asleep(t) return score_of(K_DUE, 't' .. t) ~= nil end
local function has_rotation(t)
  return redis.call('EXISTS', rot_key(t, 'f'), rot_key(t, 'r')) > 0
end

-- Wake up to n sleeping workers (BLPOP in Scheduler.wait). Bounded and expiring, so
-- tokens nobody consumed cost at most one spurious wake-up each and then disappear.
local function wake(n)
  if n <= 0 then return end
  if n > 16 then n = 16 end
  local tokens = {}
  for i = 1, n do tokens[i] = '1' end
  redis.call('LPUSH', K_WAKE, unpack(tokens))
  redis.call('LTRIM', K_WAKE, '0', '63')
  redis.call('PEXPIRE', K_WAKE, '10000')
end

-- Put a tenant in the turn order. Joining at the current virtual time V means a
-- newcomer waits at most one lap; `hint` (the virtual time it had when a lane was parked
-- or the tenant paused) stops a returning tenant from jumping ahead of its share.
local function join(t, hint)
  if redis.call('ZSCORE', K_VT, t) or is_paused(t) or is_asleep(t) then return end
  local v = vtime()
  if hint and hint > v then v = hint end
  redis.call('ZADD', K_VT, v, t)
end

-- Rates and pauses: the token arithmetic lives in rates(), at the end of this file.
local RATES -- built on first use, see rates()
local rates

-- What endpoint e can take now: free slots under its cap (fresh) and under both caps
-- (retry, which also has its own), the tokens its rate or a pause has ready (HUGE with
-- neither), when the next token is due if none is ready, its rate and its pause's end.
-- While a pick's turns run, its own leases are the only change to an endpoint's caps and
-- counts, so it reads each endpoint once and counts on (ENDPOINTS, set by pick_fair.lua
-- around its turns; nil elsewhere): one tenant's lanes or many tenants sharing one
-- destination then cost no read per lease.
local ENDPOINTS -- nil outside a pick
local function endpoint_state(e)
  local known = ENDPOINTS and ENDPOINTS[e]
  if known then return known end
  local row = ENDPOINT_ROWS.of(e)
  local state = {
    m = in_flight_limit(row), rm = row.rm, ri = row.ri, rr = row.rr, rb = retry_budget(row),
    busy = num(redis.call('ZSCORE', K_BUSY, e)),
  }
  if ENDPOINTS then ENDPOINTS[e] = state end
  return state
end

-- What e can take now: free slots (all, and retry), ready tokens of its rate or pause and
-- the next one's due time, its rate and pause, and its retry budget's tokens (fractional:
-- whole ones may be spent, the rest says when the next is due).
local function limits(e)
  local state = endpoint_state(e)
  local free = state.m - state.busy
  local rfree = state.rm - state.ri
  if free < rfree then rfree = free end
  local rate = state.rr
  local hold = score_of(K_HOLD, e)
  if rate <= 0 and not hold then return free, rfree, HUGE, nil, 0, nil, state.rb end
  local tok, due = rates().tokens('e' .. e, rate, hold)
  return free, rfree, tok, due, rate, hold, state.rb
end

-- Free slots on endpoint e for a lane of kind k, the ready tokens (a retry lane's are
-- also bounded by the retry budget), the next token's due time (if none is ready), its
-- rate and its pause.
local function capacity(e, k)
  local free, rfree, tok, due, rate, hold, tokens = limits(e)
  if k == 'r' then
    free = rfree
    local budget = math.floor(tokens)
    if budget < tok then
      tok = budget
      if budget <= 0 then
        local refill = retry_budget_due(tokens)
        if not due or refill > due then due = refill end
      end
    end
  end
  return free, tok, due, rate, hold
end

-- Park a lane whose endpoint is full. Ordered by the tenant's virtual time, so the
-- slots of one contended endpoint are shared by weight, not by who retried fastest.
-- The endpoints a call parked lanes on join `parked` with one SADD when the call ends
-- (flush_parked).
local PARKED_NOW -- begin() forgets it; made on first use
local function park(t, e, k, score)
  redis.call('ZADD', park_key(e, k), score, t)
  if not PARKED_NOW then PARKED_NOW = tally() end
  if not PARKED_NOW.by[e] then
    PARKED_NOW.by[e] = true
    PARKED_NOW.order[#PARKED_NOW.order + 1] = e
  end
end

-- A lane just became non-empty: into the tenant's rotation (front = next, for work
-- coming back from a dead worker), or straight to the park set if its endpoint is full.
local function activate(t, e, k, front)
  local free, tok, due = capacity(e, k)
  if free <= 0 or tok <= 0 then
    park(t, e, k, tonumber(redis.call('ZSCORE', K_VT, t)) or vtime())
    if free > 0 then rates().await_token(e, due) end
    return 0
  end
  if front then
    redis.call('LPUSH', rot_key(t, k), e)
  else
    redis.call('RPUSH', rot_key(t, k), e)
  end
  join(t)
  return 1
end

-- After a lane's head changed: refresh its entry in the tenant's head set and the
-- tenant's oldest-work score (O(log lanes), no scan of the tenant's lanes).
-- Returns whether the lane still holds anything. `popped`: the head that just left, if
-- that was the change; a new head in the same age step as it changes no score.
-- `head`: the lane's head if the caller read it already (false: the lane is empty).
local function note_head(t, e, k, popped, head)
  local hk = head_key(t)
  if head == nil then head = redis.call('LINDEX', lane_key(t, e, k), '0') end
  if head and popped and same_age_step(head, popped) then return true end
  if head then
    redis.call('ZADD', hk, int(ulid_ms(head)), e .. ':' .. k)
  else
    redis.call('ZREM', hk, e .. ':' .. k)
  end
  local first = redis.call('ZRANGE', hk, '0', '0', 'WITHSCORES')
  if popped and first[1] and first[1] ~= e .. ':' .. k
      and tonumber(first[2]) <= ulid_ms(popped) then
    -- Another lane was at least as old as the one popped: the tenant's age stays.
    return head ~= false
  end
  if first[1] then
    redis.call('ZADD', K_AGE, first[2], t)
  else
    redis.call('ZREM', K_AGE, t)
  end
  return head ~= false
end

-- Add `by` to one of a tenant's counts (f, r, d) in its row.
local function count_in_row(t, field, by)
  local row = TENANT_ROWS.of(t)
  row[field] = row[field] + by
  TENANT_ROWS.changed(t, row)
end

local function count_queued(t, k, by)
  count_in_row(t, k, by)
  count_stat(k, by)
end

-- A delivery becomes dispatchable: the tail of its lane (or of the FIFO line).
-- Returns how many lanes became eligible, i.e. how many sleepers are worth waking.
local function enter(t, e, k, id)
  count_queued(t, k, 1)
  if MODE == 'fifo' then
    redis.call('RPUSH', K_FIFO, id .. '|' .. t .. '|' .. e .. '|' .. k)
    return 1
  end
  if redis.call('RPUSH', lane_key(t, e, k), id) > 1 then return 0 end
  local ms = int(ulid_ms(id))
  redis.call('ZADD', head_key(t), ms, e .. ':' .. k)
  redis.call('ZADD', K_AGE, 'LT', ms, t)
  return activate(t, e, k, false)
end

-- A delivery whose lease expired goes back to the head of its lane.
local function reenter(t, e, k, id)
  count_queued(t, k, 1)
  if MODE == 'fifo' then
    redis.call('LPUSH', K_FIFO, id .. '|' .. t .. '|' .. e .. '|' .. k)
    return
  end
  if redis.call('LPUSH', lane_key(t, e, k), id) == 1 then activate(t, e, k, true) end
  note_head(t, e, k)
end

local function parse_lease(member)
  return string.match(member, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)|')
end

-- The counts in `count` change by a tally per call (count_in), written with one HMGET
-- and one HSET at write_counts: an enqueue or an ack of deliveries of many tenants and
-- endpoints then costs two commands for all their counts, not one per tenant and one per
-- endpoint.
local COUNTS -- begin() forgets it; made on first use: "t<t>" / "e<e>" -> change
local function count_in(field, by)
  if not COUNTS then COUNTS = tally() end
  local was = COUNTS.by[field]
  if not was then
    COUNTS.order[#COUNTS.order + 1] = field
    was = 0
  end
  COUNTS.by[field] = was + by
end
-- Returns the fields that reached 0 (HDEL'd): their tenant's or endpoint's row may go.
local function write_counts()
  if not COUNTS then return {} end
  local order, by = COUNTS.order, COUNTS.by
  COUNTS = nil
  if #order <= 2 then
    local gone = {}
    -- One tenant's deliveries to one endpoint (a flood's acks): an HINCRBY each, whose
    -- reply is the new count, costs less than reading and writing them.
    for _, field in ipairs(order) do
      if by[field] ~= 0 and redis.call('HINCRBY', K_COUNT, field, int(by[field])) <= 0 then
        redis.call('HDEL', K_COUNT, field)
        gone[#gone + 1] = field
      end
    end
    return gone
  end
  -- The new counts go straight into the HSET's and HDEL's arguments: a table of them
  -- by field first costs a hash insert per field.
  local was = call_list('HMGET', K_COUNT, order)
  local adds, gone = {}, {}
  for i, field in ipairs(order) do
    local value = (tonumber(was[i]) or 0) + by[field]
    if value > 0 then
      adds[#adds + 1] = field
      adds[#adds + 1] = string.format('%d', value)
    else
      gone[#gone + 1] = field
    end
  end
  call_many('HDEL', K_COUNT, gone)
  call_many('HSET', K_COUNT, adds)
  return gone
end

-- Record a lease. The slot is the lease: counts change only together with the leases
-- set, in the same script, so they cannot drift from it. Inside a pick (ENDPOINTS set),
-- the lease and the endpoint's in-flight count are written once for the whole pick
-- (flush_grants): a pick of 32 then costs one ZADD of leases, not 32.
local PENDING_LEASES -- begin() empties it
local BUSY_DIRTY -- endpoints whose in-flight count a pick changed (ENDPOINTS has it)
local function grant(id, t, e, k, deadline, worker)
  local seq = next_seq()
  local member = string.format('%s|%s|%s|%s|%d:%s', id, t, e, k, seq, worker)
  PENDING_LEASES[#PENDING_LEASES + 1] = deadline
  PENDING_LEASES[#PENDING_LEASES + 1] = member
  if k == 'r' then
    local row = ENDPOINT_ROWS.of(e)
    row.ri = row.ri + 1
    change_retry_budget(row, -1)
    ENDPOINT_ROWS.changed(e, row)
    local trow = TENANT_ROWS.of(t)
    if change_tenant_retry_budget(trow, -1) then TENANT_ROWS.changed(t, trow) end
  end
  local known = ENDPOINTS and ENDPOINTS[e]
  if known then
    known.busy = known.busy + 1
    if k == 'r' then known.ri, known.rb = known.ri + 1, known.rb - 1 end
    if not known.dirty then
      known.dirty = true
      BUSY_DIRTY[#BUSY_DIRTY + 1] = e
    end
  else
    redis.call('ZINCRBY', K_BUSY, '1', e)
  end
  count_queued(t, k, -1)
  return member
end

-- Write what grant() held back: before anything reads the leases or in-flight counts.
local function flush_grants()
  call_many('ZADD', K_LEASES, PENDING_LEASES)
  PENDING_LEASES = {}
  if #BUSY_DIRTY > 0 then
    local scored = {}
    for _, e in ipairs(BUSY_DIRTY) do
      local known = ENDPOINTS[e]
      scored[#scored + 1] = int(known.busy)
      scored[#scored + 1] = e
      known.dirty = false
    end
    call_many('ZADD', K_BUSY, scored)
    BUSY_DIRTY = {}
  end
end

-- Slots given back by one call are counted per endpoint (give_back) and written at once
-- (give_back_done): one endpoint's, as a flood's answers and acks are, with one ZINCRBY;
-- several endpoints' with one ZMSCORE, one ZADD and at most one ZREM of the busy set,
-- whatever their number. Every script ends with give_back_done (scripts.py), and one
-- that reads busy counts again (fill, activate) calls it first.
local GIVEN -- begin() empties it: endpoint -> {slots, retry slots of them}, in order
local function give_back(e, k)
  local slots = GIVEN.by[e]
  if not slots then
    slots = {0, 0}
    GIVEN.by[e] = slots
    GIVEN.order[#GIVEN.order + 1] = e
  end
  slots[1] = slots[1] + 1
  if k == 'r' then slots[2] = slots[2] + 1 end
end
local function give_back_done()
  local order, by = GIVEN.order, GIVEN.by
  if #order == 0 then return end
  GIVEN = tally()
  if #order == 1 then
    local e = order[1]
    if tonumber(redis.call('ZINCRBY', K_BUSY, int(-by[e][1]), e)) <= 0 then
      redis.call('ZREM', K_BUSY, e)
    end
  else
    local was = call_list('ZMSCORE', K_BUSY, order)
    local left = {} -- endpoint -> its live leases, false once none
    for i, e in ipairs(order) do
      local busy = num(was[i]) - by[e][1]
      left[e] = busy > 0 and int(busy)
    end
    write_scores(K_BUSY, order, left)
  end
  for _, e in ipairs(order) do
    local n, r = by[e][1], by[e][2]
    if r > 0 then
      local row = ENDPOINT_ROWS.of(e)
      row.ri = row.ri - r
      ENDPOINT_ROWS.changed(e, row)
    end
    local known = ENDPOINTS and ENDPOINTS[e]
    if known then
      known.busy = known.busy - n
      known.ri = known.ri - r
    end
  end
end

-- Drop a lease and give its slot back (give_back), unless answered.lua did already.
-- Returns nil when the lease is gone already (expired and reclaimed, maybe handed to
-- another worker): then nothing of the new holder's changes. (ack.lua does the same for
-- a whole group of leases at once.)
local function release(member)
  if redis.call('ZREM', K_LEASES, member) == 0 then return nil end
  local id, t, e, k = parse_lease(member)
  if redis.call('SREM', K_ANSWERED, member) == 0 then give_back(e, k) end
  return id, t, e, k
end

-- Un-park up to `count` lanes of kind k waiting on e, lowest virtual time first. A paused
-- or sleeping tenant's lane goes back to its rotation without counting, so it holds no
-- slot hostage.
local function unpark(e, k, count)
  local pk = park_key(e, k)
  local woken, guard = 0, count + 16
  while woken < count and guard > 0 do
    guard = guard - 1
    local top = redis.call('ZPOPMIN', pk)
    if not top[1] then break end
    redis.call('RPUSH', rot_key(top[1], k), e)
    if not is_paused(top[1]) and not is_asleep(top[1]) then
      join(top[1], tonumber(top[2]))
      woken = woken + 1
    end
  end
  return woken
end

-- Hand free slots on e to parked lanes: one candidate per free slot for each kind, and
-- no more than e has tokens ready (a candidate that loses the race re-parks; that is a
-- counted deferral, not a leak). Slots free but no token: a pick wakes them when it's due.
-- Returns how many lanes it woke, and true as well when e has no parked lane at all.
local function fill(e)
  if redis.call('EXISTS', park_key(e, 'f'), park_key(e, 'r')) == 0 then return 0, true end
  local free, rfree, tok, due, _, _, tokens = limits(e)
  local budget = math.floor(tokens)
  if free > 0 and tok <= 0 then
    rates().await_token(e, due)
    return 0
  end
  -- Each kind gets its own candidates, as for slots, so that retries keep their share
  -- of scarce tokens (the tenant's retry credit chooses; the loser re-parks).
  local woken = 0
  if free > 0 then woken = unpark(e, 'f', math.min(free, tok)) end
  if rfree > 0 and budget <= 0 then
    -- Slots, but no retry budget: parked retry lanes wait for its next token.
    if redis.call('EXISTS', park_key(e, 'r')) == 1 then
      rates().await_token(e, retry_budget_due(tokens))
    end
  elseif rfree > 0 then
    woken = woken + unpark(e, 'r', math.min(rfree, tok, budget))
  end
  return woken
end

-- fill() for each of `endpoints` that may have parked lanes (one SMISMEMBER of `parked`
-- for all): acks and answers free slots on endpoints that mostly have nothing parked.
-- One found with no park set left leaves `parked`.
local function fill_each(endpoints)
  if #endpoints == 0 then return 0 end
  local listed = call_list('SMISMEMBER', K_PARKED, endpoints)
  local woken, empty = 0, {}
  for i, e in ipairs(endpoints) do
    if listed[i] == 1 or (PARKED_NOW and PARKED_NOW.by[e]) then
      local got, none = fill(e)
      woken = woken + got
      if none then empty[#empty + 1] = e end
    end
  end
  call_many('SREM', K_PARKED, empty)
  return woken
end

local function flush_parked()
  if not PARKED_NOW then return end
  call_many('SADD', K_PARKED, PARKED_NOW.order)
  PARKED_NOW = nil
end

-- How long a worker may sleep when nothing is dispatchable: until the next delayed
-- delivery is due, the next lease may expire or the next token (rate or pause) is due, at
-- most MAX_WAIT. Rounded up to the microsecond, so a worker never wakes just too early.
local function next_event_wait()
  local wait = MAX_WAIT
  for _, key in ipairs({K_DELAYED, K_LEASES, K_DUE}) do
    local first = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    if first[2] and tonumber(first[2]) - NOW < wait then wait = tonumber(first[2]) - NOW end
  end
  if wait < 0 then wait = 0 end
  return math.ceil(wait * 1e6) / 1e6
end

-- Rates are GCRA (a token bucket kept as one number), in integer microseconds so that no
-- rounding accumulates: a rate r allows one request per T = 1/r seconds, and a burst of
-- B = max(1, floor(r)) requests (one second's worth) after a quiet spell. Each endpoint or
-- tenant with a rate has a theoretical arrival time TAT in `tat`; a request may start when
-- TAT <= now + tau, tau = (B - 1) T, and moves TAT to max(TAT, now) + T. A TAT in the past
-- is the same as none (a full bucket), so pruning those loses nothing. An endpoint's pause
-- (Retry-After, in `hold`) counts as a TAT of at least its end + tau: no token before it
-- ends, then none faster than the rate.
--
-- Built on first use in a call (begin() forgets them, as they read NOW): under EVAL, Redis
-- reruns this file's top level at every call, and each closure made there costs (more
-- with every upvalue), so a call that meets no rate and no pause never builds these.
rates = function()
  if RATES then return RATES end
  local function us(seconds) return math.floor(seconds * 1e6 + 0.5) end
  local NOW_US = us(NOW)
  local function interval_us(rate) return math.max(1, us(1 / rate)) end
  local function tolerance_us(rate)
    return (math.max(1, math.floor(rate + 1e-9)) - 1) * interval_us(rate)
  end

  local function clock(member, rate, hold)
    local tat = score_of(K_TAT, member)
    if not tat or tat < NOW_US then tat = NOW_US end
    if hold then
      local resume = us(hold) + tolerance_us(rate)
      if resume > tat then tat = resume end
    end
    return tat
  end

  -- Tokens `member` ("e<e>" or "t<t>") has ready now under `rate` per second (0: none) and
  -- a pause until `hold` (nil: none): HUGE with neither. With none ready, also returns the
  -- time (epoch seconds) the next one is due.
  local function tokens(member, rate, hold)
    if rate <= 0 then
      if hold and hold > NOW + EPS then return 0, hold end
      return HUGE
    end
    local tau = tolerance_us(rate)
    local slack = NOW_US + tau - clock(member, rate, hold)
    if slack < 0 then return 0, (NOW_US - slack) / 1e6 end
    return math.floor(slack / interval_us(rate)) + 1
  end

  -- One request started: move the token clock on. Returns when the next token is due if
  -- this one was the last ready.
  local function take(member, rate, hold)
    if rate <= 0 then return nil end
    local tat = clock(member, rate, hold) + interval_us(rate)
    redis.call('ZADD', K_TAT, int(tat), member)
    live[K_TAT] = true
    return (tat - tolerance_us(rate)) / 1e6
  end

  -- A rate was written (maybe changed): a clock earned at an older, slower rate holds the
  -- member back at most one interval of the new one. Never grants a token: at a steady
  -- rate TAT <= now + tau + T holds anyway, so this changes nothing then.
  local function clamp_clock(member, rate)
    if rate <= 0 then return end
    local tat = score_of(K_TAT, member)
    local limit = NOW_US + tolerance_us(rate) + interval_us(rate)
    if tat and tat > limit then redis.call('ZADD', K_TAT, int(limit), member) end
  end

  -- Lanes on e wait for a token that is due at `at`: a pick wakes them then (wake_due).
  local function await_token(e, at)
    redis.call('ZADD', K_DUE, at, 'e' .. e)
    live[K_DUE] = true
  end

  -- A tenant that ran out of tokens leaves vt until its next one is due, keeping `score`
  -- (where it stood in the turn order) for its return at max(score, V). Its lanes stay in
  -- its rotations; any that were candidates for a freed slot give other parked lanes the
  -- chance instead (bounded, as for a pause).
  local function tenant_sleep(t, score, due)
    redis.call('ZREM', K_VT, t)
    local row = TENANT_ROWS.of(t)
    row.s = score
    TENANT_ROWS.changed(t, row)
    redis.call('ZADD', K_DUE, due, 't' .. t)
    live[K_DUE] = true
    for _, k in ipairs({'f', 'r'}) do
      for _, e in ipairs(redis.call('LRANGE', rot_key(t, k), 0, 15)) do fill(e) end
    end
  end

  -- Its token is due (or its rate changed): back into the turn order where it stood, unless
  -- an operator paused it meanwhile (then `s` waits for the resume).
  local function tenant_wake(t)
    redis.call('ZREM', K_DUE, 't' .. t)
    live[K_DUE] = nil
    if is_paused(t) then return 0 end
    local row = TENANT_ROWS.of(t)
    local score = row.s
    if score then
      row.s = nil
      TENANT_ROWS.changed(t, row)
    end
    if not has_rotation(t) then return 0 end
    join(t, score)
    return 1
  end

  RATES = {
    now_us = NOW_US, us = us, tolerance_us = tolerance_us, tokens = tokens, take = take,
    clamp_clock = clamp_clock, await_token = await_token, tenant_sleep = tenant_sleep,
    tenant_wake = tenant_wake,
  }
  return RATES
end

-- A script's reply as the array its REPLY record (protocol.py) describes: every field in
-- its place, false (nil to the caller) where `values` has none, so the array has no hole.
local function reply_of(record, values)
  local out = {}
  for name, index in pairs(record) do
    if name ~= 'SIZE' then out[index] = values[name] or false end
  end
  return out
end

-- Start a call: its clock, its shard's keys and empty per-call state. Under EVAL, scripts.py
-- calls this right after this file; in the Function library, each function first.
local KEY_PREFIX -- the prefix the K_* names were built for: most calls keep the same shard
local function begin(keys, argv)
  P = argv[CALL.prefix]
  NOW = tonumber(argv[CALL.now])
  if NOW < 0 then
    local clock = redis.call('TIME')
    NOW = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
  end
  NOW_MS = math.floor(NOW * 1000)
  MODE = argv[CALL.mode]
  K_STATS = keys[1]
  if P ~= KEY_PREFIX then
    KEY_PREFIX = P
    K_VT, K_AGE, K_BUSY, K_LEASES = P .. 'vt', P .. 'age', P .. 'busy', P .. 'leases'
    K_ANSWERED, K_DELAYED, K_FIFO = P .. 'answered', P .. 'delayed', P .. 'fifo'
    K_PAUSED, K_WAKE, K_TAT = P .. 'paused', P .. 'wake', P .. 'tat'
    K_DUE, K_HOLD, K_COUNT, K_PARKED = P .. 'due', P .. 'hold', P .. 'count', P .. 'parked'
    K_TENANTS, K_ENDPOINTS = P .. 'tenants', P .. 'endpoints'
  end
  STATS_BY, STATS_SET, SEQ, live, COUNTS, PARKED_NOW = {}, {}, nil, {}, nil, nil
  TENANT_ROWS.reset(K_TENANTS)
  ENDPOINT_ROWS.reset(K_ENDPOINTS)
  RATES, ENDPOINTS, PENDING_LEASES, BUSY_DIRTY, GIVEN = nil, nil, {}, {}, tally()
end

-- End a call: write what it held back. Every script ends with this (scripts.py), whatever
-- it returns, so nothing held back is dropped.
local function finish()
  give_back_done()
  flush_grants()
  flush_parked()
  TENANT_ROWS.write()
  ENDPOINT_ROWS.write()
  flush_stats()
end
