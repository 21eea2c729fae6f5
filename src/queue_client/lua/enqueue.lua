-- ARGV: n, priority, delay_ms, at_ms (0: none), max_attempts, mode, then
--   mode 'p':  n payloads (ids generated), or
--   mode 'ip': n × (id, payload) (ids given: dedup applies).
-- Options are shared by the call (the client splits calls where they differ), which keeps
-- per-task arguments, the main cost of a bulk enqueue, to one or two.
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
local payloads, metas, ids, flags = {}, {}, {}, nil
local created = 0

if ARGV[6] == 'p' then
  -- Generated ids cannot clash: no lookups, indices instead of the # operator.
  for i = 1, n do
    local id = '#' .. (base + i)
    payloads[2 * i - 1] = id
    payloads[2 * i] = ARGV[6 + i]
    metas[2 * i - 1] = id
    metas[2 * i] = meta
    ids[i] = id
  end
  created = n
  flags = string.rep('1', n)
else
  local seen, fl = {}, {}
  for i = 1, n do
    local o = 5 + 2 * i
    local id = ARGV[o]
    local fresh = true
    if seen[id] then
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
    fl[i] = fresh and '1' or '0'
    if fresh then
      seen[id] = true
      created = created + 1
      payloads[2 * created - 1] = id
      payloads[2 * created] = ARGV[o + 1]
      metas[2 * created - 1] = id
      metas[2 * created] = meta
      ids[created] = id
    end
  end
  flags = table.concat(fl)
end

if created > 0 then
  bulk('HSET', K_PAYLOAD, payloads)
  bulk('HSET', K_META, metas)
  if is_delayed then
    local delayed = {}
    for i, id in ipairs(ids) do
      delayed[2 * i - 1] = due
      delayed[2 * i] = id
    end
    bulk('ZADD', K_DELAYED, delayed)
  else
    push_ready(pri, ids, false)
  end
  redis.call('HINCRBY', K_STATS, 'enqueued', created)
  wake(created)
end
return {base, flags}
