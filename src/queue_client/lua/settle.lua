-- ARGV: k, then k acks as (id, token), then m other ops as (kind, id, token, a, b, c):
--   'e' extend (a = lease_ms);  'r' retry (a = delay_ms, b = priority or '', c = reason);
--   'f' fail (a = reason)
-- Acks, by far the most common settle, cost two arguments each.
-- Returns k + m results in that order: 1 done, 0 stale (the lease is no longer this
-- token's), 2 retry turned into a dead letter because max_attempts is reached.
local now = now_ms()
local k = tonumber(ARGV[1])
local m = (#ARGV - 1 - 2 * k) / 6
local ids = {}
for i = 1, k do ids[i] = ARGV[2 * i] end
for j = 1, m do ids[k + j] = ARGV[2 + 2 * k + (j - 1) * 6 + 1] end
local toks = hmget(K_LEASE, ids)
local res, acked, settled = {}, {}, {}
local n_stale, n_retried, n_dead, n_woken = 0, 0, 0, 0
for i = 1, k do
  local id = ids[i]
  if toks[i] ~= ARGV[2 * i + 1] or settled[id] then
    res[i] = 0
    n_stale = n_stale + 1
  else
    settled[id] = true
    acked[#acked + 1] = id
    res[i] = 1
  end
end
for i = k + 1, k + m do
  local o = 2 + 2 * k + (i - k - 1) * 6 - 1
  local kind, id, tok = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3]
  if toks[i] ~= tok or settled[id] then
    res[i] = 0
    n_stale = n_stale + 1
  elseif kind == 'e' then
    redis.call('ZADD', K_LEASED, 'XX', now + tonumber(ARGV[o + 4]), id)
    res[i] = 1
  else
    settled[id] = true
    redis.call('ZREM', K_LEASED, id)
    redis.call('HDEL', K_LEASE, id)
    if kind == 'f' then
      redis.call('ZADD', K_DEAD, now, id)
      redis.call('HSET', K_ERR, id, ARGV[o + 4])
      n_dead = n_dead + 1
      res[i] = 1
    else
      local pri, ma, seq, enq = parse_meta(redis.call('HGET', K_META, id))
      local a = tonumber(redis.call('HGET', K_ATT, id) or '0')
      local reason = ARGV[o + 6]
      if ma > 0 and a >= ma then
        if reason == '' then reason = 'retry requested' end
        redis.call('ZADD', K_DEAD, now, id)
        redis.call('HSET', K_ERR, id, string.format(
          'attempt %d of %d failed (max_attempts reached): %s', a, ma, reason))
        n_dead = n_dead + 1
        res[i] = 2
      else
        if ARGV[o + 5] ~= '' then
          pri = tonumber(ARGV[o + 5])
          redis.call('HSET', K_META, id, pack_meta(pri, ma, seq, enq))
        end
        if reason ~= '' then redis.call('HSET', K_ERR, id, reason) end
        local delay = tonumber(ARGV[o + 4])
        if delay > 0 then
          redis.call('ZADD', K_DELAYED, now + delay, id)
        else
          redis.call('ZADD', K_READY, -pri, member(seq, id))
          n_woken = n_woken + 1
        end
        n_retried = n_retried + 1
        res[i] = 1
      end
    end
  end
end
if #acked > 0 then
  bulk('ZREM', K_LEASED, acked)
  forget(acked)
  redis.call('HINCRBY', K_STATS, 'acked', #acked)
end
if n_stale > 0 then redis.call('HINCRBY', K_STATS, 'stale', n_stale) end
if n_retried > 0 then redis.call('HINCRBY', K_STATS, 'retried', n_retried) end
if n_dead > 0 then redis.call('HINCRBY', K_STATS, 'dead', n_dead) end
wake(n_woken)
return res
