-- ARGV: n, priority, delay_ms, at_ms (0: none), max_attempts, then n × (id or '', payload).
-- Options are shared by the call (the client splits calls where they differ), which keeps
-- per-task arguments, the main cost of a bulk enqueue, to two.
-- Returns n × (id, 1 = created | 0 = an existing pending or leased task with that id).
local now = now_ms()
local n = tonumber(ARGV[1])
local pri, delay, at = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local meta_head = ARGV[2] .. ':' .. ARGV[5] .. ':'
local meta_tail = ':' .. now
local due = now + delay
if at > 0 then due = at end
local is_delayed = due > now
local base = redis.call('INCRBY', K_SEQ, n) - n
local payloads, metas, ready, delayed, out, seen = {}, {}, {}, {}, {}, {}
local created = 0
for i = 0, n - 1 do
  local o = 6 + i * 2
  local id = ARGV[o]
  local seq = base + i + 1
  local fresh = true
  if id == '' then
    id = '#' .. seq
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
  out[#out + 1] = id
  out[#out + 1] = fresh and 1 or 0
  if fresh then
    seen[id] = true
    created = created + 1
    payloads[#payloads + 1] = id
    payloads[#payloads + 1] = ARGV[o + 1]
    metas[#metas + 1] = id
    metas[#metas + 1] = meta_head .. seq .. meta_tail
    if is_delayed then
      delayed[#delayed + 1] = due
      delayed[#delayed + 1] = id
    else
      ready[#ready + 1] = -pri
      ready[#ready + 1] = member(seq, id)
    end
  end
end
if created > 0 then
  bulk('HSET', K_PAYLOAD, payloads)
  bulk('HSET', K_META, metas)
  bulk('ZADD', K_READY, ready)
  bulk('ZADD', K_DELAYED, delayed)
  redis.call('HINCRBY', K_STATS, 'enqueued', created)
  wake(created)
end
return out
