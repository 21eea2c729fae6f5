-- Expires up to `limit` records ended one at a time (K_EXP). Returns how many.
local function expire_single(now, limit)
  local gone = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now, 'LIMIT', 0, limit)
  if #gone == 0 then return 0 end
  local keys = {}
  for i, id in ipairs(gone) do keys[i] = rec_key(id) end
  rec_delete(gone, mget(keys))
  bulk('ZREM', K_EXP, gone)
  return #gone
end

-- Expires the run of tasks s1..s2 (text) done together (see "Runs" in lib/blocks.lua), whole: the records
-- whose numbers it holds go. Returns how many there were.
local function expire_run(s1, s2)
  run_forget(s1, s2)
  local ids = redis.call('ZRANGEBYSCORE', K_IDX, s1, s2)
  if #ids == 0 then return 0 end
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  rec_delete(ids, mget(keys))
  return #ids
end

-- The moment the tasks of list `member` ("expiry:ttl") ended.
local function ended_at_of(member)
  local exp, ttl = string.match(member, '^(%d+):(%d+)$')
  return tonumber(exp) - tonumber(ttl)
end

-- Expires up to `want` entries of the list of tasks ended together (its K_ENDS member
-- `member`), oldest first. An entry is stale when its task came back to life
-- since (a requeued dead letter, a new task under the id): its record has not ended, or
-- ended after the list's moment, and stays. Returns how many entries were used.
local function expire_list(member, want)
  local ended_at = ended_at_of(member)
  local ids = redis.call('LPOP', ends_list(member), want) or {}
  if #ids < want then redis.call('ZREM', K_ENDS, member) end
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  local vals = mget(keys)
  local gone, gone_vals = {}, {}
  for i, id in ipairs(ids) do
    local v = vals[i]
    if v then
      local _, st, at = last_entry(v)
      if is_end_state(st) and tonumber(at) <= ended_at then
        gone[#gone + 1] = id
        gone_vals[#gone] = v
      end
    end
  end
  if #gone > 0 then rec_delete(gone, gone_vals) end
  return #ids
end

-- Expires up to `limit` records ended together (the runs and lists of K_ENDS),
-- oldest first. Returns how many entries were used.
local function expire_batched(now, limit)
  local used = 0
  local due = redis.call('ZRANGEBYSCORE', K_ENDS, '-inf', now, 'LIMIT', 0, limit)
  for _, member in ipairs(due) do
    if used >= limit then break end
    local s1, s2 = run_of_end(member)
    if s1 then
      -- whole: a run is at most a take's worth of tasks
      used = used + math.max(1, expire_run(s1, s2))
    else
      used = used + expire_list(member, limit - used)
    end
  end
  return used
end

-- Deletes up to `limit` records whose time is up, with their index entries. Returns how
-- many entries of the expiry indexes were used.
local function expire_records(now, limit)
  local n = expire_single(now, limit)
  if n < limit then n = n + expire_batched(now, limit - n) end
  if n < limit then packets_sweep_oldest() end
  return n
end
