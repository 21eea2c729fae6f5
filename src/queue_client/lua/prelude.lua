-- Shared by every gaffer queue script. All keys of one queue share a hash tag, so each
-- script touches a single Redis Cluster slot. The order of KEYS is fixed by keys.rs.
local K_READY, K_DELAYED, K_LEASED, K_DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_PAYLOAD, K_META, K_ATT, K_ERR = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_STATS, K_SEQ, K_TOK, K_WAKE = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_REC, K_IDX, K_CONF, K_FROZEN = KEYS[13], KEYS[14], KEYS[15], KEYS[16]

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

-- Where a task is: 'ready', 'due' (delayed, due, not yet moved), 'delayed', 'leased',
-- 'frozen' or 'dead' (nil when unknown), the score that goes with it (due time, lease expiry, time of
-- death), its meta, and its lease member and token when leased.
local function locate(id, now)
  local m = redis.call('HGET', K_META, id)
  if not m then return nil end
  local s = redis.call('ZSCORE', K_DEAD, id)
  if s then return 'dead', tonumber(s), m end
  s = redis.call('ZSCORE', K_FROZEN, id)
  if s then return 'frozen', tonumber(s), m end
  s = redis.call('ZSCORE', K_DELAYED, id)
  if s then
    if tonumber(s) > now then return 'delayed', tonumber(s), m end
    return 'due', tonumber(s), m
  end
  local member, exp, tok = find_lease(id)
  if member then return 'leased', exp, m, member, tok end
  return 'ready', 0, m
end

-- ---------------------------------------------------------------------------------------
-- Task records (see record.rs). A tracked task has a hash `K_REC .. id` beside the queue:
--   s state, p priority, a attempt, m max_attempts, c created ms, d due ms, u updated ms,
--   b submitted_by, e last error, r result (JSON text), h history, w '1' while an api
--   instance waits for its end.
-- History entries are separated by \30, their fields by \31:
--   state, at ms, attempt, host, slot, note[, count when folded].
-- A record is written only where one exists (take and settle need no flag: an untracked
-- task simply has none); enqueue creates it when the queue tracks. It gets a TTL when the
-- task ends (done, failed, cancelled), so it goes by itself, without a reaper.
local RS, FS = '\30', '\31'
-- Where the end of a task someone waits for is announced: `ns:{Q}:ended` (a channel, not
-- a key).
local ENDED_CHANNEL = string.sub(K_REC, 1, -3) .. 'ended'

local function rec_key(id)
  return K_REC .. id
end

-- Separators cannot appear inside a field; a note loses them rather than corrupting the
-- history.
local function clean(s)
  if not s or s == '' then return '' end
  return (string.gsub(s, '[\30\31]', ' '))
end

-- The history with one transition added: folded into the last entry (its count goes up)
-- when state, attempt, host, slot and note are all the same.
local function history_add(h, state, now, attempt, host, slot, note)
  local ident = state .. FS .. attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
  if h and h ~= '' then
    local head, last = string.match(h, '^(.*)\30([^\30]*)$')
    if not last then head, last = nil, h end
    local st, at, rest = string.match(last, '^([^\31]*)\31([^\31]*)\31(.*)$')
    if st then
      local body, count = string.match(rest, '^(.*)\31(%d+)$')
      if not body then body, count = rest, '1' end
      if st .. FS .. body == ident then
        local folded = st .. FS .. at .. FS .. body .. FS .. (tonumber(count) + 1)
        if head then return head .. RS .. folded end
        return folded
      end
    end
    return h .. RS .. state .. FS .. now .. FS .. attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
  end
  return state .. FS .. now .. FS .. attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
end

-- Records one transition of a tracked task: new state, history entry, and any extra
-- fields (a flat list of field, value). Returns false when the task has no record. A nil
-- `attempt` keeps the record's; a nil `host` takes host and slot from the last entry.
-- `ttl_ms` > 0 ends the record's life that long from now (the task ended); the waiters of
-- an ended task are told on the queue's channel.
local function record(id, state, now, attempt, host, slot, note, extra, ttl_ms)
  local key = rec_key(id)
  local cur = redis.call('HMGET', key, 'h', 'w', 'a')
  if not cur[1] then return false end
  if attempt == nil then attempt = tonumber(cur[3]) or 0 end
  if host == nil then
    -- The slot that held the lease (a lease that expired names the slot that lost it).
    local last = string.match(cur[1], '([^\30]*)$')
    host, slot = string.match(last, '^[^\31]*\31[^\31]*\31[^\31]*\31([^\31]*)\31([^\31]*)')
    host, slot = host or '', slot or ''
  end
  local args = {'s', state, 'u', now, 'a', attempt,
    'h', history_add(cur[1], state, now, attempt, host, slot, note)}
  if extra then
    for i = 1, #extra do args[#args + 1] = extra[i] end
  end
  redis.call('HSET', key, unpack(args))
  if ttl_ms and ttl_ms > 0 then
    redis.call('PEXPIRE', key, ttl_ms)
    if cur[2] then
      redis.call('HDEL', key, 'w')
      redis.call('PUBLISH', ENDED_CHANNEL, id)
    end
  end
  return true
end

-- The configured record TTL of the queue's tasks; the client passes it with every call
-- that can end a task, and keeps it here for admin paths that cannot know the config.
local function history_ttl(arg)
  local t = tonumber(arg)
  if t and t > 0 then return t end
  return tonumber(redis.call('HGET', K_CONF, 'ttl')) or 604800000
end

-- The index of a queue's records for listing: K_IDX (every record) and K_IDX .. ':' ..
-- submitter, zsets of ids scored by a per-queue sequence, so newest first is highest
-- score and a cursor is a score. Records expire by themselves; their index entries are
-- swept here, `k` entries per call from a cursor kept in K_CONF that wraps around, so the
-- sweep keeps pace with what enqueues add and no call does more than its share.
local function sweep_index(idx, field, k)
  local from = redis.call('HGET', K_CONF, field) or '0'
  local rows = redis.call('ZRANGE', idx, '(' .. from, '+inf', 'BYSCORE', 'LIMIT', 0, k, 'WITHSCORES')
  local gone = {}
  for i = 1, #rows, 2 do
    if redis.call('EXISTS', rec_key(rows[i])) == 0 then gone[#gone + 1] = rows[i] end
  end
  if #gone > 0 then bulk('ZREM', idx, gone) end
  if #rows < 2 * k then
    redis.call('HSET', K_CONF, field, '0')
  else
    redis.call('HSET', K_CONF, field, rows[#rows])
  end
end

local function submitter_index(by)
  return K_IDX .. ':' .. by
end

-- Creates the records of new tasks (all with the same options) and indexes them.
-- `replace`: ids were given, so an old finished record with the same id may be there.
local function records_new(ids, seqs, state, now, pri, ma, due, by, note, ttl_ms, replace)
  local first = history_add(nil, state, now, 0, '', '', note)
  local scored = {}
  for i, id in ipairs(ids) do
    local key = rec_key(id)
    if replace then redis.call('DEL', key) end
    redis.call('HSET', key, 's', state, 'p', pri, 'a', 0, 'm', ma, 'c', now, 'd', due,
      'u', now, 'b', by, 'h', first)
    if ttl_ms and ttl_ms > 0 then redis.call('PEXPIRE', key, ttl_ms) end
    scored[2 * i - 1] = seqs[i]
    scored[2 * i] = id
  end
  bulk('ZADD', K_IDX, scored)
  if by ~= '' then bulk('ZADD', submitter_index(by), scored) end
end
