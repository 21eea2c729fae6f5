local function glob_escape(s)
  return (string.gsub(s, '([%*%?%[%]\\])', '\\%1'))
end

-- The lease of a task by id: O(tasks in flight), for admin paths (find, cancel) only.
-- A task in a batch lease is found there; `split`: the batch is split first, so that the
-- member returned is in K_LEASED for the caller to change.
local function find_lease(id, split)
  local cursor = '0'
  repeat
    local r = redis.call('ZSCAN', K_LEASED, cursor, 'MATCH', '*:' .. glob_escape(id), 'COUNT', 1000)
    cursor = r[1]
    local items = r[2]
    for i = 1, #items, 2 do
      local mid, tok = lease_parts(items[i])
      if mid == id then return items[i], tonumber(items[i + 1]), tok end
    end
  until cursor == '0'
  return batch_lease_find(id, split)
end


-- Where a task is: 'ready', 'due' (delayed, due, not yet moved), 'delayed', 'leased',
-- 'frozen' or 'dead' (nil when unknown), the score that goes with it (due time, lease expiry, time of
-- death), its meta, and its lease member and token when leased (`split`: see
-- find_lease); last, the payload of a packet's task (nil for any other). `unpack`: a
-- packet's waiting task is made an ordinary one first (packet_alive), for a caller that
-- changes it (nil: as `split`).
local function locate(id, now, split, unpack_it)
  local m = meta_of(id)
  local payload
  if not m then
    local where
    if unpack_it == nil then unpack_it = split end
    where, m, payload = packet_alive(id, unpack_it)
    if not where then return nil end
  end
  local s = redis.call('ZSCORE', K_DEAD, id)
  if s then return 'dead', tonumber(s), m end
  s = redis.call('ZSCORE', K_FROZEN, id)
  if s then return 'frozen', tonumber(s), m end
  s = redis.call('ZSCORE', K_DELAYED, id)
  if s then
    if tonumber(s) > now then return 'delayed', tonumber(s), m end
    return 'due', tonumber(s), m
  end
  local member, exp, tok = find_lease(id, split)
  -- (a packet's task not made ordinary: its payload, which no field holds)
  if member then return 'leased', exp, m, member, tok, payload end
  return 'ready', 0, m, nil, nil, payload
end
