-- A system's switch as one of its queues sees it (`gaffer system NAME …`).
-- ARGV: op, then
--   'set', value ('STATE:NAME'): the queue's switch; back to active wakes its takers;
--   'waiting', offset, limit: ids of waiting tasks (ready lists by priority, then delayed)
--     from `offset` on, at most `limit`;
--   'note', offset, limit, note: the same tasks' records get a waiting entry with `note`
--     (once per pause, never per tick); returns how many tasks were looked at.
local op = ARGV[1]

local function waiting_slice(offset, limit)
  local out = {}
  for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    local list = ready_list(p)
    local len = redis.call('LLEN', list)
    if offset >= len then
      offset = offset - len
    else
      for _, id in ipairs(redis.call('LRANGE', list, offset, offset + (limit - #out) - 1)) do
        out[#out + 1] = id
      end
      offset = 0
      if #out >= limit then return out end
    end
  end
  for _, id in ipairs(redis.call('ZRANGE', K_DELAYED, offset, offset + (limit - #out) - 1)) do
    out[#out + 1] = id
  end
  return out
end

if op == 'set' then
  redis.call('HSET', K_CONF, 'system', ARGV[2])
  if string.match(ARGV[2], '^active:') then wake(WAKE_CAP) end
  return 1
elseif op == 'waiting' then
  return waiting_slice(tonumber(ARGV[2]), tonumber(ARGV[3]))
elseif op == 'note' then
  local ids = waiting_slice(tonumber(ARGV[2]), tonumber(ARGV[3]))
  if redis.call('EXISTS', K_IDX) == 1 then
    local now = now_ms()
    for _, id in ipairs(ids) do record(id, 'waiting', now, nil, nil, nil, ARGV[4], nil) end
  end
  return #ids
end
return redis.error_reply('unknown system op ' .. tostring(op))
