-- ARGV: n, lease_ms, housekeeping limit
-- Returns {now, token, expiry, id, attempt, payload, ...} when tasks were taken, or
-- {now, 0, hint_ms} when none: hint_ms = time until the next delayed task is due or the
-- next lease expires (-1: nothing scheduled), so an idle taker knows when to look again.
local now = now_ms()
local n, lease, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])

-- 1. Expired leases come back here, so no separate reaper is needed. Each counts as a
--    failed attempt (the attempt was counted when it was taken).
local expired = redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', now, 'LIMIT', 0, limit)
if #expired > 0 then
  local n_dead = 0
  for _, id in ipairs(expired) do
    local a = attempts_of(redis.call('HGET', K_ATT, id))
    redis.call('HSET', K_ATT, id, a)
    local m = redis.call('HGET', K_META, id)
    if m then
      local pri, ma, seq = parse_meta(m)
      if ma > 0 and a >= ma then
        redis.call('ZADD', K_DEAD, now, id)
        redis.call('HSET', K_ERR, id, string.format(
          'lease expired on attempt %d of %d (max_attempts reached)', a, ma))
        n_dead = n_dead + 1
      else
        redis.call('ZADD', K_READY, -pri, member(seq, id))
        redis.call('HSET', K_ERR, id, string.format('lease expired on attempt %d', a))
      end
    end
  end
  bulk('ZREM', K_LEASED, expired)
  redis.call('HINCRBY', K_STATS, 'expired', #expired)
  if n_dead > 0 then redis.call('HINCRBY', K_STATS, 'dead', n_dead) end
end

-- 2. Delayed tasks that are due join the ready set in their place.
local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'LIMIT', 0, limit)
if #due > 0 then
  local metas = hmget(K_META, due)
  local ready = {}
  for i, id in ipairs(due) do
    if metas[i] then
      local pri, _, seq = parse_meta(metas[i])
      ready[#ready + 1] = -pri
      ready[#ready + 1] = member(seq, id)
    end
  end
  bulk('ZADD', K_READY, ready)
  bulk('ZREM', K_DELAYED, due)
end

-- 3. Hand out up to n, highest priority first, FIFO within a priority.
local popped = redis.call('ZPOPMIN', K_READY, n)
local k = #popped / 2
if k == 0 then
  local hint = -1
  local d = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if d[2] then hint = math.max(0, tonumber(d[2]) - now) end
  local l = redis.call('ZRANGE', K_LEASED, 0, 0, 'WITHSCORES')
  if l[2] then
    local h = math.max(0, tonumber(l[2]) - now)
    if hint < 0 or h < hint then hint = h end
  end
  return {now, 0, hint}
end
local tok = redis.call('INCR', K_TOK)
local exp = now + lease
local ids = {}
for i = 1, k do ids[i] = string.sub(popped[2 * i - 1], 17) end
local atts = hmget(K_ATT, ids)
local att_pairs, leased = {}, {}
local suffix = ':' .. tok
for i, id in ipairs(ids) do
  local a = (tonumber(atts[i]) or 0) + 1
  atts[i] = a
  att_pairs[2 * i - 1] = id
  att_pairs[2 * i] = a .. suffix
  leased[2 * i - 1] = exp
  leased[2 * i] = id
end
bulk('HSET', K_ATT, att_pairs)
bulk('ZADD', K_LEASED, leased)
local payloads = hmget(K_PAYLOAD, ids)
local out = {now, tok, exp}
for i, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = atts[i]
  out[#out + 1] = payloads[i]
end
-- A full batch with more waiting: wake a peer, so backlog spreads over idle takers.
if k == n and redis.call('ZCARD', K_READY) > 0 then wake(1) end
return out
