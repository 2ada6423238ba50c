-- promote.lua: an operator's "retry now". A delivery waiting in the delayed set for its
-- retry enters its tenant's retry lane at once, as promote_due would at its due time.
-- PROMOTE.member the delayed member "id|t|e|k". Returns 1, or 0 if it was not waiting there
-- (promoted by a pick already, leased, finished, or never scheduled): nothing changed.
-- One script, so a pick cannot promote the same member in between: it enters once.
local member = ARGV[PROMOTE.member]
if redis.call('ZREM', K_DELAYED, member) == 0 then return 0 end
local id, t, e, k = string.match(member, '^([^|]+)|([^|]+)|([^|]+)|([^|]+)$')
count_in_row(t, 'd', -1)
wake(enter(t, e, k, id))
return 1
