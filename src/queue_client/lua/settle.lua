-- ARGV: k, then k acks as (id, lease), then m other ops as (kind, id, lease, a, b, c),
-- where lease = "attempt:token" as the take handed it out:
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
local toks = hmget(K_ATT, ids)
local res, acked, errs, settled = {}, {}, {}, {}
local n_stale, n_retried, n_dead, n_woken = 0, 0, 0, 0
for i = 1, k do
  local id = ids[i]
  if toks[i] ~= ARGV[2 * i + 1] or settled[id] then
    res[i] = 0
    n_stale = n_stale + 1
  else
    settled[id] = true
    acked[#acked + 1] = id
    -- Only a task past its first attempt can have a last error to clean up.
    if string.sub(toks[i], 1, 2) ~= '1:' then errs[#errs + 1] = id end
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
    local a = attempts_of(toks[i])
    redis.call('ZREM', K_LEASED, id)
    redis.call('HSET', K_ATT, id, a)
    if kind == 'f' then
      redis.call('ZADD', K_DEAD, now, id)
      redis.call('HSET', K_ERR, id, ARGV[o + 4])
      n_dead = n_dead + 1
      res[i] = 1
    else
      local pri, ma, enq = parse_meta(redis.call('HGET', K_META, id))
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
          redis.call('HSET', K_META, id, pack_meta(pri, ma, enq))
        end
        if reason ~= '' then redis.call('HSET', K_ERR, id, reason) end
        local delay = tonumber(ARGV[o + 4])
        if delay > 0 then
          redis.call('ZADD', K_DELAYED, now + delay, id)
        else
          push_ready(pri, {id}, false)
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
  bulk('HDEL', K_PAYLOAD, acked)
  bulk('HDEL', K_META, acked)
  bulk('HDEL', K_ATT, acked)
  bulk('HDEL', K_ERR, errs)
  redis.call('HINCRBY', K_STATS, 'acked', #acked)
end
if n_stale > 0 then redis.call('HINCRBY', K_STATS, 'stale', n_stale) end
if n_retried > 0 then redis.call('HINCRBY', K_STATS, 'retried', n_retried) end
if n_dead > 0 then redis.call('HINCRBY', K_STATS, 'dead', n_dead) end
wake(n_woken)
return res
