-- retry_later.lua: these attempts failed; free each slot and hold each delivery in the
-- delayed set until due, when a pick moves it into its tenant's retry lane.
-- From RETRY_LATER.pairs on, RETRY_PAIR groups: lease member, due (epoch seconds).
-- Returns for each pair 1, or 0 if
-- the lease was lost. One call for a settled group's retries: a retry storm (a
-- destination down, every attempt failing) costs one script call per group, not per
-- delivery.
local done, freed = {}, {}
local retried = 0
for i = RETRY_LATER.pairs, #ARGV, RETRY_PAIR.SIZE do
  local id, t, e = release(ARGV[i + RETRY_PAIR.member])
  if id then
    local due = tonumber(ARGV[i + RETRY_PAIR.due])
    redis.call('ZADD', K_DELAYED, due, id .. '|' .. t .. '|' .. e .. '|r')
    count_in_row(t, 'd', 1)
    retried = retried + 1
    if freed[#freed] ~= e then freed[#freed + 1] = e end
    done[#done + 1] = 1
  else
    done[#done + 1] = 0
  end
end
give_back_done()
if retried == 0 then return done end
count_stat('out:retry', retried)
local woken = 1 -- a sleeper re-reads when the next delayed delivery is due
if MODE == 'fair' then woken = woken + fill_each(freed) end
wake(woken)
return done
