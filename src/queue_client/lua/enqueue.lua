-- ARGV: n, priority, delay_ms, at_ms (0: none), max_attempts, then n × (id or '', payload).
-- Options are shared by the call (the client splits calls where they differ), which keeps
-- per-task arguments, the main cost of a bulk enqueue, to two.
-- Returns {base, flags}: generated ids are '#' .. (base + i) for the i-th task (1-based),
-- and flags holds one character per task: '1' created, '0' an existing pending or leased
-- task with that id was kept. Replies stay small, which matters as much as the work.
local now = now_ms()
local n = tonumber(ARGV[1])
local pri, delay, at = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local meta = pack_meta(ARGV[2], ARGV[5], now)
local due = now + delay
if at > 0 then due = at end
local is_delayed = due > now
local base = redis.call('INCRBY', K_SEQ, n) - n
local payloads, metas, ids, delayed, flags, seen = {}, {}, {}, {}, {}, {}
for i = 0, n - 1 do
  local o = 6 + i * 2
  local id = ARGV[o]
  local fresh = true
  if id == '' then
    id = '#' .. (base + i + 1)
  elseif seen[id] then
    fresh = false
  elseif redis.call('HEXISTS', K_META, id) == 1 then
    if redis.call('ZSCORE', K_DEAD, id) then
      -- a dead letter with this id is superseded by the new task
      redis.call('ZREM', K_DEAD, id)
      redis.call('HDEL', K_ERR, id)
      redis.call('HDEL', K_ATT, id)
    else
      fresh = false
    end
  end
  flags[i + 1] = fresh and '1' or '0'
  if fresh then
    if ARGV[o] ~= '' then seen[id] = true end
    payloads[#payloads + 1] = id
    payloads[#payloads + 1] = ARGV[o + 1]
    metas[#metas + 1] = id
    metas[#metas + 1] = meta
    if is_delayed then
      delayed[#delayed + 1] = due
      delayed[#delayed + 1] = id
    else
      ids[#ids + 1] = id
    end
  end
end
local created = #payloads / 2
if created > 0 then
  bulk('HSET', K_PAYLOAD, payloads)
  bulk('HSET', K_META, metas)
  push_ready(pri, ids, false)
  bulk('ZADD', K_DELAYED, delayed)
  redis.call('HINCRBY', K_STATS, 'enqueued', created)
  wake(created)
end
return {base, table.concat(flags)}
