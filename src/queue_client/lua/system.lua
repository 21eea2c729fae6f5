-- A system's switch as one of its queues sees it (`gaffer system NAME …`).
-- ARGV: the head (SystemHead in args.rs, read by name as A.op, …): op, switch, generation,
-- offset, limit, note; every op sends all of it, what it does not use as '' or 0. By op:
--   'set' (switch: 'STATE:NAME', generation): the queue's switch; back to active wakes its
--     takers. Each switch of a system counts its generation up (in the cluster's hash of
--     switches), and the queue keeps the one its switch came from: a write from an older
--     reading (the manager's tick, racing an operator's switch) is refused, returns 0;
--   'clear' (switch: the system, generation): removes the queue's switch (the queue left the system,
--     or the system has none), unless it is one of that system's newer than the
--     generation read (0: none was read); returns 1 when removed;
--   'waiting' (offset, limit): ids of waiting tasks (ready lists by priority, then delayed)
--     from `offset` on, at most `limit`;
--   'note' (offset, limit, note): the same tasks' records get a waiting entry with `note`
--     (once per pause, never per tick); returns how many tasks were looked at.
local A = head(ARGV, SYSTEM_HEAD)
local op = A.op

-- The waiting tasks of list `list` from `offset` on, at most `limit` added to `out`,
-- where the entry of a packet (see lib/blocks.lua) stands for its waiting tasks: a walk of
-- the list, for a queue that has packets. Returns the offset left.
local function waiting_in_packets(list, offset, limit, out)
  local at = 0
  while #out < limit do
    local page = redis.call('LRANGE', list, at, at + 199)
    if #page == 0 then break end
    for _, e in ipairs(page) do
      for _, id in ipairs(entry_ids(e)) do
        if offset > 0 then
          offset = offset - 1
        elseif #out < limit then
          out[#out + 1] = id
        end
      end
    end
    at = at + #page
  end
  return offset
end

local function waiting_slice(offset, limit)
  local out = {}
  local packets = queue_has_packets()
  for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    local list = ready_list(p)
    local len = redis.call('LLEN', list)
    if packets then
      offset = waiting_in_packets(list, offset, limit, out)
      if #out >= limit then return out end
    elseif offset >= len then
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

-- Whether the queue's switch is one of `system`'s newer than generation `gen`.
local function newer_switch(system, gen)
  local cur = redis.call('HGET', K_CONF, 'system')
  if not cur or string.match(cur, '^%a+:(.*)$') ~= system then return false end
  return (tonumber(redis.call('HGET', K_CONF, 'system_gen')) or 0) > gen
end

if op == 'set' then
  local value, gen = A.switch, tonumber(A.generation) or 0
  if newer_switch(string.match(value, '^%a+:(.*)$'), gen) then return 0 end
  redis.call('HSET', K_CONF, 'system', value, 'system_gen', gen)
  if string.match(value, '^active:') then wake(WAKE_CAP) end
  return 1
elseif op == 'clear' then
  if newer_switch(A.switch, tonumber(A.generation) or 0) then return 0 end
  return redis.call('HDEL', K_CONF, 'system', 'system_gen') > 0 and 1 or 0
elseif op == 'waiting' then
  return waiting_slice(tonumber(A.offset), tonumber(A.limit))
elseif op == 'note' then
  local ids = waiting_slice(tonumber(A.offset), tonumber(A.limit))
  if redis.call('EXISTS', K_IDX) == 1 then
    local now = now_ms()
    for _, id in ipairs(ids) do record(id, 'waiting', now, nil, nil, nil, A.note, nil) end
  end
  return #ids
end
return redis.error_reply('unknown system op ' .. tostring(op))
