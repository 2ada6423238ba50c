-- clear.lua: delete every key of the schedule in one atomic step (before a rebuild).
-- A SCAN + UNLINK from the client interleaves with enqueues still arriving from ingest:
-- it could delete a tenant's turn order yet keep a lane an enqueue created a moment
-- later, leaving that lane's deliveries where no pick ever looks. Inside one script an
-- enqueue sees the whole old schedule or none of it. It blocks Redis for the scan, once
-- per rebuild (after Redis lost the schedule), never on the hot path.
-- ARGV[1] = the MATCH pattern of the schedule's keys. Returns how many were deleted.
local cursor = '0'
local deleted = 0
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  local found = page[2]
  for first = 1, #found, 500 do
    redis.call('UNLINK', unpack(found, first, math.min(first + 499, #found)))
  end
  deleted = deleted + #found
until cursor == '0'
return deleted
