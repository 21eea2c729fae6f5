-- A system's token bucket, cluster-wide: `rate` tokens a second, at most `burst` saved up.
-- KEYS[1]: the bucket (a hash: tokens, ts, granted), in the system's own hash slot, so a
-- take acquires its tokens here first and then takes at most that many from its queue.
-- ARGV: the head (BucketHead in args.rs): rate (tokens/s), burst, want (> 0: acquire up to want; < 0: hand -want back
-- unused). Returns {granted, wait_ms}: wait_ms, when nothing was granted, is how long
-- until the next token.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local A = head(ARGV, BUCKET_HEAD)
local rate, burst, want = tonumber(A.rate), tonumber(A.burst), tonumber(A.want)
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(v[1]) or burst
local ts = tonumber(v[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
local got, wait = 0, 0
if want < 0 then
  tokens = math.min(burst, tokens - want)
  redis.call('HINCRBY', KEYS[1], 'granted', want)
else
  got = math.min(want, math.floor(tokens))
  tokens = tokens - got
  if got > 0 then
    redis.call('HINCRBY', KEYS[1], 'granted', got)
  else
    wait = math.ceil((1 - tokens) * 1000 / rate)
  end
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', now)
return {got, wait}
