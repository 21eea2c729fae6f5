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
    if key then
      redis.call(cmd, key, unpack(items, i, j))
    else
      redis.call(cmd, unpack(items, i, j))
    end
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
-- Task records (see record.rs). A tracked task has a string `K_REC .. id` beside the
-- queue: its fields joined by \31, then \30 and its history. A string, not a hash: a hash
-- with a value over 64 bytes (a history soon is) leaves Redis's compact encoding and
-- costs several times the memory.
--   fields: s state, a attempt, u updated ms, w '1' while an api instance waits for the
--           task's end, p priority, m max_attempts, c created ms, d due ms,
--           b submitted_by, e last error, r result (JSON text)
--   The four that every take and ack change come first, so the hot path rewrites a prefix
--   and appends an entry without splitting the rest (see rec_step_fast).
--   history entries, separated by \30, fields by \31:
--           state, at ms, attempt, host, slot, note[, count when folded]
-- A record is written only where one exists (take and settle need no flag: an untracked
-- task simply has none); enqueue creates it when the queue tracks. It gets a TTL when the
-- task ends (done, failed, cancelled), so it goes by itself, without a reaper.
local RS, FS = '\30', '\31'
local F = {s = 1, a = 2, u = 3, w = 4, p = 5, m = 6, c = 7, d = 8, b = 9, e = 10, r = 11}
local NF = 11
-- Where the end of a task someone waits for is announced: `ns:{Q}:ended` (a channel, not
-- a key).
local ENDED_CHANNEL = string.sub(K_REC, 1, -3) .. 'ended'

local function rec_key(id)
  return K_REC .. id
end

-- Separators cannot appear inside a field; a note loses them rather than corrupting the
-- record.
local function clean(s)
  if not s or s == '' then return '' end
  return (string.gsub(s, '[\30\31]', ' '))
end

-- A stored record as its fields (a table of NF strings) and its history string.
local function rec_parse(v)
  local cut = string.find(v, RS, 1, true)
  local head, hist = v, ''
  if cut then head, hist = string.sub(v, 1, cut - 1), string.sub(v, cut + 1) end
  local f, pos = {}, 1
  for i = 1, NF do
    local j = string.find(head, FS, pos, true)
    if j then
      f[i] = string.sub(head, pos, j - 1)
      pos = j + 1
    else
      f[i] = string.sub(head, pos)
      pos = #head + 2
    end
  end
  return f, hist
end

local function rec_pack(f, hist)
  return table.concat(f, FS, 1, NF) .. RS .. hist
end

-- The history with one transition added: folded into the last entry (its count goes up)
-- when state, attempt, host, slot and note are all the same.
local function history_add(h, state, now, attempt, host, slot, note)
  local body = attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
  local entry = state .. FS .. now .. FS .. body
  if h == '' then return entry end
  local start = 1
  local i = string.find(h, RS, 1, true)
  while i do
    start = i + 1
    i = string.find(h, RS, start, true)
  end
  local last = string.sub(h, start)
  local st, at, rest = string.match(last, '^([^\31]*)\31([^\31]*)\31(.*)$')
  if st == state then
    local lbody, count = string.match(rest, '^(.*)\31(%d+)$')
    if not lbody then lbody, count = rest, '1' end
    if lbody == body then
      return string.sub(h, 1, start - 1) .. st .. FS .. at .. FS .. body .. FS .. (tonumber(count) + 1)
    end
  end
  return h .. RS .. entry
end

-- The record `v` after one transition: new state, history entry and the fields in `set`
-- (a table field name → value). A nil `attempt` keeps the record's; a nil `host` takes
-- host and slot from the last entry (a lease that expired names the slot that lost it).
-- Returns the new string and whether an api instance waits for the task.
local function rec_step(v, state, now, attempt, host, slot, note, set)
  local f, hist = rec_parse(v)
  if attempt == nil then attempt = tonumber(f[F.a]) or 0 end
  if host == nil then
    local last = string.match(hist, '([^\30]*)$')
    host, slot = string.match(last, '^[^\31]*\31[^\31]*\31[^\31]*\31([^\31]*)\31([^\31]*)')
    host, slot = host or '', slot or ''
  end
  f[F.s], f[F.u], f[F.a] = state, now, attempt
  if set then
    for k, val in pairs(set) do f[F[k]] = (k == 'e') and clean(val) or val end
  end
  local watched = f[F.w] == '1'
  return rec_pack(f, history_add(hist, state, now, attempt, host, slot, note)), watched
end

-- The hot path's transition: take (running) and ack (done) set state, attempt (nil keeps
-- it) and updated time, and append an entry that never folds (the entry before a
-- running one is never running, the one before done is running). Splits only the four
-- leading fields: a full parse costs ten times as much, per task.
local function rec_step_fast(v, state, now, attempt, host, slot)
  local p1 = string.find(v, FS, 1, true)
  local p2 = string.find(v, FS, p1 + 1, true)
  local p3 = string.find(v, FS, p2 + 1, true)
  local p4 = string.find(v, FS, p3 + 1, true)
  if attempt == nil then attempt = string.sub(v, p1 + 1, p2 - 1) end
  local watched = p4 == p3 + 2
  return state .. FS .. attempt .. FS .. now .. string.sub(v, p3) .. RS .. state .. FS .. now
    .. FS .. attempt .. FS .. host .. FS .. slot .. FS, watched
end

-- Stores a record; `ttl_ms` > 0 ends its life that long from now (the task ended), and
-- tells the api instances waiting for it.
local function rec_store(id, v, watched, ttl_ms)
  if ttl_ms and ttl_ms > 0 then
    if watched then
      local f, hist = rec_parse(v)
      f[F.w] = ''
      v = rec_pack(f, hist)
    end
    redis.call('SET', rec_key(id), v, 'PX', ttl_ms)
    if watched then redis.call('PUBLISH', ENDED_CHANNEL, id) end
  else
    redis.call('SET', rec_key(id), v)
  end
end

-- Records one transition of a tracked task (see rec_step). Returns false when the task
-- has no record.
local function record(id, state, now, attempt, host, slot, note, set, ttl_ms)
  local v = redis.call('GET', rec_key(id))
  if not v then return false end
  local nv, watched = rec_step(v, state, now, attempt, host, slot, note, set)
  rec_store(id, nv, watched, ttl_ms)
  return true
end

-- A hot-path transition (rec_step_fast) for many tasks at once: one MGET, then one MSET (no TTL) or a SET
-- each (TTL). `attempts` may be nil (keep each record's) or a table by position.
local function record_many(ids, state, now, attempts, host, slot, ttl_ms)
  if #ids == 0 then return end
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  local vals = {}
  local i = 1
  while i <= #keys do
    local j = math.min(i + CHUNK - 1, #keys)
    local part = redis.call('MGET', unpack(keys, i, j))
    for x = 1, #part do vals[#vals + 1] = part[x] end
    i = j + 1
  end
  local pairs_out = {}
  for k, id in ipairs(ids) do
    local v = vals[k]
    if v then
      local nv, watched = rec_step_fast(v, state, now, attempts and attempts[k], host, slot)
      if ttl_ms and ttl_ms > 0 then
        rec_store(id, nv, watched, ttl_ms)
      else
        pairs_out[#pairs_out + 1] = keys[k]
        pairs_out[#pairs_out + 1] = nv
      end
    end
  end
  if #pairs_out > 0 then
    local x = 1
    while x <= #pairs_out do
      local y = math.min(x + CHUNK - 1, #pairs_out)
      redis.call('MSET', unpack(pairs_out, x, y))
      x = y + 1
    end
  end
end

-- The configured record TTL of the queue's tasks; the client passes it with every call
-- that can end a task.
local function history_ttl(arg)
  local t = tonumber(arg)
  if t and t > 0 then return t end
  return 604800000
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

-- Creates the records of new tasks (all with the same options) and indexes them. An old
-- finished record with the same id is replaced.
local function records_new(ids, seqs, state, now, pri, ma, due, by, note, ttl_ms)
  local f = {state, 0, now, '', pri, ma, now, due, by, '', ''}
  local v = rec_pack(f, history_add('', state, now, 0, '', '', note))
  local scored, kv = {}, {}
  for i, id in ipairs(ids) do
    if ttl_ms and ttl_ms > 0 then
      redis.call('SET', rec_key(id), v, 'PX', ttl_ms)
    else
      kv[#kv + 1] = rec_key(id)
      kv[#kv + 1] = v
    end
    scored[2 * i - 1] = seqs[i]
    scored[2 * i] = id
  end
  if #kv > 0 then bulk('MSET', nil, kv) end
  bulk('ZADD', K_IDX, scored)
  if by ~= '' then bulk('ZADD', submitter_index(by), scored) end
end
