-- Returns {ready (due), delayed (not yet due), leased, dead, frozen, oldest due age (ms
-- since the longest-waiting due task became due; 0 when none), field, value, ...counters}
local now = now_ms()
local due = redis.call('ZCOUNT', K_DELAYED, '-inf', now)
-- (a due task still in K_DELAYED waits for a take to move it: its score is when it came due)
local oldest = ready_oldest_due()
local first = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')[2]
if first and tonumber(first) <= now and (not oldest or tonumber(first) < oldest) then
  oldest = tonumber(first)
end
local out = {
  ready_count() + due,
  redis.call('ZCARD', K_DELAYED) - due,
  leased_count(),
  redis.call('ZCARD', K_DEAD),
  redis.call('ZCARD', K_FROZEN),
  oldest and math.max(0, now - oldest) or 0,
}
local counters = redis.call('HGETALL', K_STATS)
for i = 1, #counters do out[#out + 1] = counters[i] end
return out
