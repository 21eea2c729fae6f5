-- The ceiling for enqueue: ids from a counter, payloads in a hash, a FIFO list. Nothing else.
local n = #ARGV
local base = redis.call('INCRBY', KEYS[3], n) - n
local h, ids = {}, {}
for i = 1, n do
  -- (one integer format: Lua's own number-to-text is a floating-point printf)
  local id = string.format('#%d', base + i)
  h[2 * i - 1] = id
  h[2 * i] = ARGV[i]
  ids[i] = id
end
redis.call('HSET', KEYS[1], unpack(h))
redis.call('RPUSH', KEYS[2], unpack(ids))
return n
