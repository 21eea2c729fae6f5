-- Shared by every gaffer queue script. All keys of one queue share a hash tag, so each
-- script touches a single Redis Cluster slot. The order of KEYS is fixed by keys.rs.
local K_READY, K_DELAYED, K_LEASED, K_DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_PAYLOAD, K_META, K_ATT, K_ERR = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_STATS, K_SEQ, K_TOK, K_WAKE = KEYS[9], KEYS[10], KEYS[11], KEYS[12]

-- Wake-up tokens kept at most: enough to wake that many idle takers at once.
local WAKE_CAP = 256
-- Lua's unpack is limited to a few thousand values: variadic calls go in chunks (even size,
-- so score/member and field/value pairs never split).
local CHUNK = 4000

-- Redis's own clock, so that clients with skewed clocks agree on leases and due times.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function bulk(cmd, key, items)
  local n = #items
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    redis.call(cmd, key, unpack(items, i, j))
    i = j + 1
  end
end

local function hmget(key, ids)
  local out = {}
  local n = #ids
  local i = 1
  while i <= n do
    local j = math.min(i + CHUNK - 1, n)
    local part = redis.call('HMGET', key, unpack(ids, i, j))
    for k = 1, #part do out[#out + 1] = part[k] end
    i = j + 1
  end
  return out
end

-- Ready tasks wait in one list per priority (FIFO, O(1) push and pop); K_READY is the
-- sorted set of priorities that have a list, score -priority, so the highest comes first.
-- The lists' names extend K_READY and so share its hash tag and cluster slot.
local function ready_list(pri)
  return K_READY .. ':' .. pri
end

-- Appends ids (all of one priority) to the back of their list, or the front when `front`
-- (a reclaimed task was taken before everything behind it).
local function push_ready(pri, ids, front)
  if #ids == 0 then return end
  bulk(front and 'LPUSH' or 'RPUSH', ready_list(pri), ids)
  redis.call('ZADD', K_READY, -pri, pri)
end

-- Groups ids by priority and pushes each group: for moves of many tasks at once.
local function push_ready_grouped(pris, ids, front)
  local groups, order = {}, {}
  for i, id in ipairs(ids) do
    local p = pris[i]
    if not groups[p] then
      groups[p] = {}
      order[#order + 1] = p
    end
    local g = groups[p]
    g[#g + 1] = id
  end
  for _, p in ipairs(order) do push_ready(p, groups[p], front) end
end

local function ready_count()
  local total = 0
  for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    total = total + redis.call('LLEN', ready_list(p))
  end
  return total
end

-- meta = "priority:max_attempts:enqueued_ms"
local function parse_meta(m)
  local pri, ma, enq = string.match(m, '^(-?%d+):(%d+):(%d+)$')
  return tonumber(pri), tonumber(ma), tonumber(enq)
end

local function pack_meta(pri, ma, enq)
  return pri .. ':' .. ma .. ':' .. enq
end

-- A lease is the member "token:id" of K_LEASED, scored by its expiry. The client settles
-- with the token it was handed, so checking a lease is a ZMSCORE, and a reclaimed or
-- re-leased task has a member with another token: the old holder's settle finds nothing.
-- take and settle build members inline (tok .. ':' .. id) on their hot paths.
local function lease_parts(m)
  local tok, id = string.match(m, '^(%d+):(.*)$')
  return id, tok
end

local function glob_escape(s)
  return (string.gsub(s, '([%*%?%[%]\\])', '\\%1'))
end

-- The lease of a task by id: O(tasks in flight), for admin paths (find, cancel) only.
local function find_lease(id)
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
  return nil
end

-- K_ATT holds the attempts a task has finished without being acked (absent: none), so a
-- task that succeeds at its first attempt never touches it.
local function attempts_of(v)
  return tonumber(v) or 0
end

local function wake(n)
  if n > 0 then
    local toks = {}
    for i = 1, math.min(n, WAKE_CAP) do toks[i] = '1' end
    redis.call('RPUSH', K_WAKE, unpack(toks))
    redis.call('LTRIM', K_WAKE, -WAKE_CAP, -1)
  end
end

local function forget(ids)
  bulk('HDEL', K_PAYLOAD, ids)
  bulk('HDEL', K_META, ids)
  bulk('HDEL', K_ATT, ids)
  bulk('HDEL', K_ERR, ids)
end

-- Where a task is: 'ready', 'due' (delayed, due, not yet moved), 'delayed', 'leased' or
-- 'dead' (nil when unknown), the score that goes with it (due time, lease expiry, time of
-- death), its meta, and its lease member and token when leased.
local function locate(id, now)
  local m = redis.call('HGET', K_META, id)
  if not m then return nil end
  local s = redis.call('ZSCORE', K_DEAD, id)
  if s then return 'dead', tonumber(s), m end
  s = redis.call('ZSCORE', K_DELAYED, id)
  if s then
    if tonumber(s) > now then return 'delayed', tonumber(s), m end
    return 'due', tonumber(s), m
  end
  local member, exp, tok = find_lease(id)
  if member then return 'leased', exp, m, member, tok end
  return 'ready', 0, m
end
