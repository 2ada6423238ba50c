-- lib.lua: the data-structure rules every scheduler script shares. scripts.py prepends
-- this file to each script, so each script stays one atomic unit (no other client can
-- interleave) without each one restating the rules.
--
-- Calling convention. KEYS[1] is the stats hash: declared so Redis Cluster routes the
-- call to the shard's slot; every other key carries the same {shard} hash tag, so one
-- script touches one slot. ARGV[1] = key prefix "wh:{<shard>}:", ARGV[2] = now in epoch
-- seconds (negative: read the Redis clock, so all workers share one clock), ARGV[3] =
-- mode, "fair" or "fifo". Script-specific arguments start at ARGV[4].
--
-- Names: t = tenant token (decimal id, "fb" for the fallback lane), e = endpoint id,
-- k = lane kind ("f" fresh, "r" retry). Keys after the prefix:
--   q:t:e:k     LIST  one lane: delivery ids, oldest first
--   rot:t:k     LIST  the tenant's rotation of endpoints whose k-lane may be dispatched
--   park:e:k    ZSET  tenants whose k-lane to e waits for a slot, by virtual time
--   vt          ZSET  unpaused tenants with a lane in a rotation, by virtual time of next turn
--   head:t      ZSET  the tenant's non-empty lanes ("e:k"), by enqueue ms of their head
--   age         ZSET  tenants with queued work, by enqueue ms of their oldest queued delivery
--   t:t         HASH  tenant: f r d i (fresh/retry/delayed/in-flight counts), w weight,
--                     c retry credit (ppm), u used part of an unfinished turn,
--                     s virtual time kept while paused
--   e:e         HASH  endpoint: m rm caps, ri live retry leases, n deliveries anywhere here
--   busy        ZSET  endpoints by number of live leases (the in-flight count)
--   leases      ZSET  "id|t|e|k|token" by deadline
--   delayed     ZSET  "id|t|e|k" by due time
--   fifo        LIST  "id|t|e|k" (FIFO mode only)
--   paused      SET   paused tenants (configuration, so it outlives an idle spell)
--   stats       HASH  f r (depths), V (virtual time), seq, deferrals, fallback_total, tenants,
--                     out:<outcome> (finished leases by outcome)
--   wake        LIST  wake-up tokens for sleeping workers (short expiry)
-- Invariant: a non-empty lane is in exactly one place, its tenant's rotation or its
-- endpoint's park set; a tenant is in vt exactly when it is unpaused and has a rotation.
-- Empty lists/sets vanish by themselves and hashes are deleted at zero, so an idle
-- tenant or endpoint leaves no key behind.

local P = ARGV[1]
local NOW = tonumber(ARGV[2])
if NOW < 0 then
  local clock = redis.call('TIME')
  NOW = tonumber(clock[1]) + tonumber(clock[2]) / 1e6
end
local NOW_MS = math.floor(NOW * 1000)
local MODE = ARGV[3]
local FALLBACK = 'fb'
local PPM = 1000000 -- retry credit is kept in integer parts per million: no float drift
local MAX_WAIT = 5 -- seconds a worker may sleep without re-checking

local K_STATS = KEYS[1]
local K_VT = P .. 'vt'
local K_AGE = P .. 'age'
local K_BUSY = P .. 'busy'
local K_LEASES = P .. 'leases'
local K_DELAYED = P .. 'delayed'
local K_FIFO = P .. 'fifo'
local K_PAUSED = P .. 'paused'
local K_WAKE = P .. 'wake'

local function lane_key(t, e, k) return P .. 'q:' .. t .. ':' .. e .. ':' .. k end
local function rot_key(t, k) return P .. 'rot:' .. t .. ':' .. k end
local function park_key(e, k) return P .. 'park:' .. e .. ':' .. k end
local function head_key(t) return P .. 'head:' .. t end
local function tenant_key(t) return P .. 't:' .. t end
local function endpoint_key(e) return P .. 'e:' .. e end

local function num(value) return tonumber(value) or 0 end

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
  local value = 0
  for i = 1, 10 do value = value * 32 + (B32[string.byte(id, i)] or 0) end
  return value
end

local function vtime() return num(redis.call('HGET', K_STATS, 'V')) end
local function is_paused(t) return redis.call('SISMEMBER', K_PAUSED, t) == 1 end
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
  redis.call('LTRIM', K_WAKE, 0, 63)
  redis.call('PEXPIRE', K_WAKE, 10000)
end

-- Put a tenant in the turn order. Joining at the current virtual time V means a
-- newcomer waits at most one lap; `hint` (the virtual time it had when a lane was parked
-- or the tenant paused) stops a returning tenant from jumping ahead of its share.
local function join(t, hint)
  if redis.call('ZSCORE', K_VT, t) or is_paused(t) then return end
  local v = vtime()
  if hint and hint > v then v = hint end
  redis.call('ZADD', K_VT, v, t)
end

-- Free slots on endpoint e for a lane of kind k: the in-flight count is the number of
-- live leases (busy), and retries are held to their own cap as well.
local function free_slots(e, k)
  local cfg = redis.call('HMGET', endpoint_key(e), 'm', 'rm', 'ri')
  local free = num(cfg[1]) - num(redis.call('ZSCORE', K_BUSY, e))
  if k == 'r' then
    local rfree = num(cfg[2]) - num(cfg[3])
    if rfree < free then free = rfree end
  end
  return free
end

-- Park a lane whose endpoint is full. Ordered by the tenant's virtual time, so the
-- slots of one contended endpoint are shared by weight, not by who retried fastest.
local function park(t, e, k, score)
  redis.call('ZADD', park_key(e, k), score, t)
end

-- A lane just became non-empty: into the tenant's rotation (front = next, for work
-- coming back from a dead worker), or straight to the park set if its endpoint is full.
local function activate(t, e, k, front)
  if free_slots(e, k) <= 0 then
    park(t, e, k, tonumber(redis.call('ZSCORE', K_VT, t)) or vtime())
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
-- Returns whether the lane still holds anything.
local function note_head(t, e, k)
  local hk = head_key(t)
  local head = redis.call('LINDEX', lane_key(t, e, k), 0)
  if head then
    redis.call('ZADD', hk, ulid_ms(head), e .. ':' .. k)
  else
    redis.call('ZREM', hk, e .. ':' .. k)
  end
  local first = redis.call('ZRANGE', hk, 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', K_AGE, first[2], t)
  else
    redis.call('ZREM', K_AGE, t)
  end
  return head ~= false
end

local function count_queued(t, k, by)
  redis.call('HINCRBY', tenant_key(t), k, by)
  redis.call('HINCRBY', K_STATS, k, by)
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
  local ms = ulid_ms(id)
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

-- Delete a tenant's hash once nothing of it is queued, delayed or in flight.
local function tenant_gc(t)
  local tk = tenant_key(t)
  local c = redis.call('HMGET', tk, 'f', 'r', 'd', 'i')
  if num(c[1]) + num(c[2]) + num(c[3]) + num(c[4]) == 0 then
    if redis.call('DEL', tk) == 1 then redis.call('HINCRBY', K_STATS, 'tenants', -1) end
  end
end

local function parse_lease(member)
  return string.match(member, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)|')
end

-- Record a lease. The slot is the lease: counts change only together with the leases
-- set, in the same script, so they cannot drift from it.
local function grant(id, t, e, k, deadline, worker)
  local seq = redis.call('HINCRBY', K_STATS, 'seq', 1)
  local member = id .. '|' .. t .. '|' .. e .. '|' .. k .. '|' .. seq .. ':' .. worker
  redis.call('ZADD', K_LEASES, deadline, member)
  redis.call('ZINCRBY', K_BUSY, 1, e)
  if k == 'r' then redis.call('HINCRBY', endpoint_key(e), 'ri', 1) end
  redis.call('HINCRBY', tenant_key(t), 'i', 1)
  count_queued(t, k, -1)
  return member
end

-- Drop a lease and its slot. Returns nil when the lease is gone already (expired and
-- reclaimed, maybe handed to another worker): then nothing of the new holder's changes.
local function release(member)
  if redis.call('ZREM', K_LEASES, member) == 0 then return nil end
  local id, t, e, k = parse_lease(member)
  if tonumber(redis.call('ZINCRBY', K_BUSY, -1, e)) <= 0 then redis.call('ZREM', K_BUSY, e) end
  if k == 'r' then redis.call('HINCRBY', endpoint_key(e), 'ri', -1) end
  redis.call('HINCRBY', tenant_key(t), 'i', -1)
  return id, t, e, k
end

-- Un-park up to `count` lanes of kind k waiting on e, lowest virtual time first. A paused
-- tenant's lane goes back to its rotation without counting, so it holds no slot hostage.
local function unpark(e, k, count)
  local pk = park_key(e, k)
  local woken, guard = 0, count + 16
  while woken < count and guard > 0 do
    guard = guard - 1
    local top = redis.call('ZPOPMIN', pk)
    if not top[1] then break end
    redis.call('RPUSH', rot_key(top[1], k), e)
    if not is_paused(top[1]) then
      join(top[1], tonumber(top[2]))
      woken = woken + 1
    end
  end
  return woken
end

-- Hand free slots on e to parked lanes: one candidate per free slot for each kind
-- (a candidate that loses the race re-parks; that is a counted deferral, not a leak).
local function fill(e)
  if redis.call('EXISTS', park_key(e, 'f'), park_key(e, 'r')) == 0 then return 0 end
  local woken = 0
  local free = free_slots(e, 'f')
  if free > 0 then woken = unpark(e, 'f', free) end
  free = free_slots(e, 'r')
  if free > 0 then woken = woken + unpark(e, 'r', free) end
  return woken
end

-- How long a worker may sleep when nothing is dispatchable: until the next delayed
-- delivery is due or the next lease may expire, at most MAX_WAIT.
local function next_event_wait()
  local wait = MAX_WAIT
  for _, key in ipairs({K_DELAYED, K_LEASES}) do
    local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if first[2] and tonumber(first[2]) - NOW < wait then wait = tonumber(first[2]) - NOW end
  end
  if wait < 0 then wait = 0 end
  return wait
end
