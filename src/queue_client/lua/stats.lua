-- Returns {ready (due), delayed (not yet due), leased, dead, frozen, field, value,
-- ...counters}
local now = now_ms()
local due = redis.call('ZCOUNT', K_DELAYED, '-inf', now)
local out = {
  ready_count() + due,
  redis.call('ZCARD', K_DELAYED) - due,
  leased_count(),
  redis.call('ZCARD', K_DEAD),
  redis.call('ZCARD', K_FROZEN),
}
local counters = redis.call('HGETALL', K_STATS)
for i = 1, #counters do out[#out + 1] = counters[i] end
return out
