-- ARGV: n, then n × (id or '', payload, priority, delay_ms, at_ms or 0, max_attempts)
-- Returns n × (id, 1 = created | 0 = an existing pending or leased task with that id).
local now = now_ms()
local n = tonumber(ARGV[1])
local base = redis.call('INCRBY', K_SEQ, n) - n
local payloads, metas, ready, delayed, out, seen = {}, {}, {}, {}, {}, {}
local created = 0
for i = 0, n - 1 do
  local o = 2 + i * 6
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
    local pri, delay, at = tonumber(ARGV[o + 2]), tonumber(ARGV[o + 3]), tonumber(ARGV[o + 4])
    payloads[#payloads + 1] = id
    payloads[#payloads + 1] = ARGV[o + 1]
    metas[#metas + 1] = id
    metas[#metas + 1] = pack_meta(pri, tonumber(ARGV[o + 5]), seq, now)
    local due = now + delay
    if at > 0 then due = at end
    if due > now then
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
