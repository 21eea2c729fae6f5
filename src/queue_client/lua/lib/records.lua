-- ---------------------------------------------------------------------------------------
-- Task records (see record.rs). A tracked task has a string `K_REC .. id` beside the
-- queue: its fields joined by \31, then \30 and its history, entries separated by \30.
-- A string, not a hash: a hash with a value over 64 bytes (a history soon is) leaves
-- Redis's compact encoding and costs several times the memory.
--   fields:  p priority, m max_attempts, c created ms, d due ms, b submitted_by,
--            e last error, r result (JSON text), g chain (the global task's id; records
--            written before chains had no g, which reads as none)
--   entries: state, at ms, attempt, host, slot, note[, count when folded]
-- The task's state, attempt and updated time are those of its last entry, except while a
-- slot holds the task: a take writes the running entries of its whole batch in one MSET,
-- a string `K_LEASED .. ':run:' .. id` per task holding the entry without its state, and
-- the attempt's end (ack, retry, failure, lease expiry, cancel) moves the entry into the
-- record before its own; readers add it meanwhile (rec_current). A batch lease (see
-- "Batch leases") names its taker once for the batch instead. Strings, not one hash:
-- a hash of a few hundred fields is a listpack, where each of a batch's HSET, HMGET and
-- HDEL fields is a linear search (measured at 1.4 µs a field). The ack of a whole batch
-- lease (the hot path) writes no record: see "Runs" in lib/blocks.lua. Any other ack APPENDs both
-- entries at once (they never fold: the entry before a running one is never running, the
-- one before done is running), without reading the record.
-- The hot path reads no record and parses none (a full parse costs about 11 µs a task).
-- A record is written only where one exists (take and settle check once per call that the
-- queue tracks); enqueue creates it when the queue tracks. When the task ends (done,
-- failed, cancelled) one at a time, its id goes into K_EXP scored by the moment its record
-- expires (`history_ttl` later). Tasks the hot path ends together (an ack of a batch) go
-- into one list per moment instead, `K_EXP .. ':b:' .. expiry .. ':' .. ttl`, listed in
-- the zset K_ENDS scored by that expiry: one RPUSH per batch, where a zset entry per task
-- cost as much as the record's own APPEND. Takes, the manager's housekeeping and enqueues
-- that dedup against records delete the expired ones, a bounded number per call, like
-- expired leases: no per-key TTL to set task by task, and no reaper. Reads write nothing:
-- they leave a due record to those sweeps and do not show it (rec_visible).
-- Who waits for a task's end (an api instance's sync submit) is in the set K_WATCH; the
-- end is then published on ENDED_CHANNEL.
local RS, FS = '\30', '\31'
local F = {p = 1, m = 2, c = 3, d = 4, b = 5, e = 6, r = 7, g = 8}
local NF = 8
-- Where the end of a task someone waits for is announced: `ns:{Q}:ended` (a channel, not
-- a key).

local function rec_key(id)
  return K_REC .. id
end

-- A page of K_IDX for a migration pass: the ids of up to `budget` entries from score
-- `from` on, past the `skip` entries of that score already seen (scores need not be
-- unique), and where the next page starts ('SCORE SKIP'); nil when none is left.
local function idx_page(from, skip, budget)
  local got = redis.call('ZRANGEBYSCORE', K_IDX, from, '+inf', 'WITHSCORES', 'LIMIT', skip, budget)
  if #got == 0 then return nil end
  local ids = {}
  for i = 1, #got, 2 do ids[#ids + 1] = got[i] end
  local last, n = got[#got], 0
  for i = #got, 2, -2 do
    if got[i] ~= last then break end
    n = n + 1
  end
  if last == from then n = n + skip end
  return ids, last .. ' ' .. n
end

-- The running entry of a leased task (see above): "at FS attempt FS host FS slot FS".
local function run_key(id)
  return K_LEASED .. ':run:' .. id
end

-- The zset of the lists of ended tasks (see above), and one of those lists.
local function ends_list(member)
  return K_ENDS .. ':' .. member
end

-- (Tasks acked as a whole batch lease write nothing to their records: see "Runs" in
-- lib/blocks.lua.)

local function is_end_state(st)
  return st == 'done' or st == 'failed' or st == 'cancelled'
end

local function submitter_index(by)
  return K_IDX .. ':' .. by
end

-- Longest note or error a record keeps (bytes): a handler's error can be megabytes (an exec
-- reply may be 64 MiB), and a task retried without end writes one per attempt.
local NOTE_MAX = 4096

-- Separators cannot appear inside a field; a note loses them rather than corrupting the
-- record, and is cut at NOTE_MAX.
local function clean(s)
  if not s or s == '' then return '' end
  if #s > NOTE_MAX then
    -- (cut between UTF-8 characters: back off while the next byte continues one)
    local cut = NOTE_MAX
    while cut > 0 and string.byte(s, cut + 1) >= 128 and string.byte(s, cut + 1) < 192 do
      cut = cut - 1
    end
    s = string.sub(s, 1, cut) .. ' ... (' .. (#s - cut) .. ' bytes more)'
  end
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

-- The chain field (the last of the NF head fields) read without parsing the record: a
-- full parse per parent cost more than the rest of chain.lua's calls.
local G_PAT = '^' .. ('[^\30\31]*\31'):rep(NF - 1) .. '([^\30\31]*)\30'
-- A record's chain ('' none).
local function chain_of(v)
  return string.match(v, G_PAT) or ''
end

local function rec_pack(f, hist)
  return table.concat(f, FS, 1, NF) .. RS .. hist
end

-- The last entry of a history: its start, state, at, attempt, host, slot.
local function last_entry(h)
  local start = 1
  local i = string.find(h, RS, 1, true)
  while i do
    start = i + 1
    i = string.find(h, RS, start, true)
  end
  local last = string.sub(h, start)
  local st, at, att, host, slot = string.match(last, '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)')
  return start, st, at, att, host, slot
end

-- An entry as it is stored.
local function entry(state, now, attempt, host, slot, note)
  return state .. FS .. now .. FS .. attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
end

-- Most entries a history keeps: its first (how the task came) and its newest, so that a
-- task retried without end (`max_attempts = 0`) keeps a record of bounded size.
local HISTORY_MAX = 100

-- `h` with the entries between its first and its newest HISTORY_MAX - 1 left out.
local function history_trim(h)
  local starts = {1}
  local i = string.find(h, RS, 1, true)
  while i do
    starts[#starts + 1] = i + 1
    i = string.find(h, RS, i + 1, true)
  end
  if #starts <= HISTORY_MAX then return h end
  return string.sub(h, 1, starts[2] - 1) .. string.sub(h, starts[#starts - HISTORY_MAX + 2])
end

-- The history with one transition added: folded into the last entry (its count goes up)
-- when state, attempt, host, slot and note are all the same.
local function history_add(h, state, now, attempt, host, slot, note)
  local e = entry(state, now, attempt, host, slot, note)
  if h == '' then return e end
  local start, st, at = last_entry(h)
  if st == state then
    local body = attempt .. FS .. host .. FS .. slot .. FS .. clean(note)
    local last = string.sub(h, start)
    local rest = string.sub(last, #st + #at + 3)
    local lbody, count = string.match(rest, '^(.*)\31(%d+)$')
    if not lbody then lbody, count = rest, '1' end
    if lbody == body then
      return string.sub(h, 1, start - 1) .. st .. FS .. at .. FS .. body .. FS .. (tonumber(count) + 1)
    end
  end
  return history_trim(h .. RS .. e)
end

-- A task ended: its record expires `ttl_ms` from now, and whoever waits for it is told.
local function ended(id, now, ttl_ms)
  redis.call('ZADD', K_EXP, now + ttl_ms, id)
  if redis.call('SREM', K_WATCH, id) == 1 then
    redis.call('PUBLISH', ENDED_CHANNEL, id)
  end
end
