-- Shared by every gaffer queue script. All keys of one queue share a hash tag, so each
-- script touches a single Redis Cluster slot. The order of KEYS is fixed by keys.rs.
local K_READY, K_DELAYED, K_LEASED, K_DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local K_PAYLOAD, K_META, K_ATT, K_ERR = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local K_STATS, K_SEQ, K_TOK, K_WAKE = KEYS[9], KEYS[10], KEYS[11], KEYS[12]
local K_REC, K_IDX, K_CONF, K_FROZEN = KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local K_EXP, K_WATCH = KEYS[17], KEYS[18]
-- Packets of follow-ups (see "Packets" below): the prefix of their names, the zset of live
-- ones and the count of tasks their ready entries stand for beyond one each.
local PACKET = '#p'
local K_PKTS = K_REC .. PACKET .. 's'
local K_PKTW = K_PKTS .. ':w'

-- Whether the queue holds data of any layout: every enqueue writes K_SEQ; tasks, dead
-- letters and records outlive it only if deleted by hand.
local function holds_data()
  return redis.call('EXISTS', K_SEQ, K_PAYLOAD, K_META, K_IDX, K_DEAD) > 0
end

-- The queue's layout version (layout.rs; LAYOUT, LAYOUT_UNRECORDED and LAYOUT_FIELD come
-- from Rust, ahead of this prelude), checked first by every queue script (scripts.rs): a
-- gaffer reads no form it does not know. A queue holding data and no layout field is of
-- LAYOUT_UNRECORDED; one holding none is new, and a script that writes (`stamp`) records
-- the current layout. The error's first word is the code queue_client/error.rs maps.
local function layout_check(stamp)
  local v = redis.call('HGET', K_CONF, LAYOUT_FIELD)
  if v == LAYOUT then return end
  if not v then
    if not holds_data() then
      if stamp then redis.call('HSET', K_CONF, LAYOUT_FIELD, LAYOUT) end
      return
    end
    v = LAYOUT_UNRECORDED
  end
  local q = string.match(K_CONF, '{(.*)}')
  local hint = 'run gaffer migrate ' .. q
  if (tonumber(v) or 0) > tonumber(LAYOUT) then hint = 'upgrade gaffer' end
  error({err = 'LAYOUT queue ' .. q .. ' has layout ' .. v .. ', this gaffer needs layout '
    .. LAYOUT .. ': ' .. hint})
end

-- How many of ARGV are the script's arguments: a body that scripts.rs wraps in a function
-- (settle.lua in settle_take, long) gets its own as a parameter, and may then be handed a
-- longer ARGV whose first ARGN are its own (no copy per task).
local ARGN = #ARGV

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

-- The same clock in µs (under 2^53 for millennia, so a Lua number holds it exactly).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
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

-- The values of string keys, nil (false) where there is none, in chunks.
local function mget(keys)
  if #keys == 0 then return {} end
  if #keys <= CHUNK then return redis.call('MGET', unpack(keys)) end
  local vals = {}
  local i = 1
  while i <= #keys do
    local j = math.min(i + CHUNK - 1, #keys)
    local part = redis.call('MGET', unpack(keys, i, j))
    for x = 1, #part do vals[i + x - 1] = part[x] end
    i = j + 1
  end
  return vals
end

local function hmget(key, ids)
  if #ids == 0 then return {} end
  if #ids <= CHUNK then return redis.call('HMGET', key, unpack(ids)) end
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

-- Appends ids (all of one priority) to the back of their list, or puts them at the front
-- when `front` (reclaimed or given back tasks were taken before everything behind them),
-- in their order either way: LPUSH puts each id before the ones pushed earlier, so the
-- front's are pushed last to first.
local function push_ready(pri, ids, front)
  if #ids == 0 then return end
  if front and #ids > 1 then
    local rev = {}
    for i = #ids, 1, -1 do rev[#rev + 1] = ids[i] end
    ids = rev
  end
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
  return total + (tonumber(redis.call('GET', K_PKTW)) or 0)
end

-- meta = "priority:max_attempts:enqueued_ms" for an untracked task; a tracked one's goes
-- on ".SEQ:CHAIN": SEQ its record's sequence number (its score in K_IDX, which the slot
-- hands back with its acks, see K_DONE), CHAIN what chains need to know of it without
-- reading its record: '' (in no chain), 'g' and the chain's id (the global task of that
-- chain, see chain_name) or 'c' and the chain's id (a follow-up).
local function parse_meta(m)
  local pri, ma, enq = string.match(m, '^(-?%d+):(%d+):(%d+)')
  return tonumber(pri), tonumber(ma), tonumber(enq)
end

-- A meta's head (priority:max_attempts:enqueued_ms[.SEQ]) and its CHAIN field ('', or
-- 'g' or 'c' and the chain; nil in an untracked task's meta).
local function meta_chain_field(m)
  local head, rest = string.match(m, '^(%-?%d+:%d+:[%d%.]+)(.*)$')
  return head, rest and string.match(rest, '^:(.*)$')
end

local function pack_meta(pri, ma, enq)
  return pri .. ':' .. ma .. ':' .. enq
end

-- The meta with another priority, the rest as it was.
local function meta_with_priority(m, pri)
  return pri .. string.match(m, '^-?%d+(.*)$')
end

-- The payload hash holds one more field, '' (no task has an empty id), whose
-- value is longer than Redis keeps in a listpack (`hash-max-listpack-value`, 64 by
-- default): the hash is then a hash table from the first enqueue on, and stays one, the
-- pin keeping it from ever being emptied and deleted. A queue its slots keep nearly empty
-- would otherwise hold its tasks in a listpack, where each field of a batch's HSET, HMGET
-- and HDEL is found by a scan of the whole hash: in a callgrind profile of a two-step
-- chain (whose second queue is always nearly empty) lpFind was 23 % of Redis's work.
local PIN = string.rep('-', 80)
local function pinned(items)
  items[#items + 1] = ''
  items[#items + 1] = PIN
  return items
end

-- A lease is the member "token:id" of K_LEASED, scored by its expiry. The client settles
-- with the token it was handed, so checking a lease is a lookup by member (settle moves
-- held ones to -inf, see settle.lua), and a reclaimed or
-- re-leased task has a member with another token: the old holder's settle finds nothing.
-- take and settle build members inline (tok .. ':' .. id) on their hot paths. A take of
-- first attempts leases its tasks as one batch instead (see "Batch leases" below).
local function lease_parts(m)
  local tok, id = string.match(m, '^(%d+):(.*)$')
  return id, tok
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

-- A task is one field of K_PAYLOAD: its meta, a newline, its payload (a meta holds no
-- newline). One field instead of a meta hash beside the payload hash saves a hash entry
-- written at enqueue and deleted at the end: in a bare enqueue loop the second HSET cost
-- 70 % more than the rest of the loop. A take hands out the whole value; the client cuts
-- the meta off (lease.rs), so no loop over the tasks is needed here. (Releases before
-- 2026-11-24 kept metas in a hash of their own, K_META: `gaffer migrate` moves them.)
local function task_value(meta, payload)
  return meta .. '\n' .. payload
end

-- The meta of a stored value.
local function value_meta(v)
  return string.match(v, '^[^\n]*')
end

-- The metas of ids, false where there is no such task.
local function metas_of(ids)
  local vals = hmget(K_PAYLOAD, ids)
  local out = {}
  for i = 1, #ids do
    local v = vals[i]
    out[i] = (v and value_meta(v)) or false
  end
  return out
end

-- A task's meta, or nil when there is no such task.
local function meta_of(id)
  return metas_of({id})[1] or nil
end

-- A task's meta and payload, or nil when there is no such task.
local function task_of(id)
  local v = redis.call('HGET', K_PAYLOAD, id)
  if not v then return nil end
  local cut = string.find(v, '\n', 1, true)
  return string.sub(v, 1, cut - 1), string.sub(v, cut + 1)
end

-- A task's meta rewritten, its payload kept.
local function set_meta(id, m)
  local _, payload = task_of(id)
  if payload then redis.call('HSET', K_PAYLOAD, id, task_value(m, payload)) end
end

local function forget(ids)
  bulk('HDEL', K_PAYLOAD, ids)
  bulk('HDEL', K_ATT, ids)
  bulk('HDEL', K_ERR, ids)
end

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
-- lease (the hot path) writes no record: see K_DONE below. Any other ack APPENDs both
-- entries at once (they never fold: the entry before a running one is never running, the
-- one before done is running), without reading the record.
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
local ENDED_CHANNEL = string.sub(K_REC, 1, -3) .. 'ended'

local function rec_key(id)
  return K_REC .. id
end

-- Chains. A chain's id is minted from its global task's queue and record number,
-- '~c' .. QUEUE .. '.' .. SEQ: unique in the namespace while the queue lives (its counter
-- never goes back; a queue dropped and made again starts over, and readers tell an older
-- chain's leftovers by their records' time: `crate::chain`), the same on one server and
-- on a cluster, and a form no client id may take (`crate::queue_client::check_id`). The
-- same task run again under its id has a new number, so a new chain. Follow-up ids derive
-- from it (`crate::chain::derived_id`), and each queue lists the members it holds of each
-- chain in chain_index(CHAIN), written in the step that enqueues them: a reader asks every
-- queue's list and the global task's queue's K_IDX (by the number in the chain's id), and
-- nothing is claimed or renamed. A list lives twice its queue's history_ttl after its last
-- member was added, so it outlives their records. A string of ids separated by FS, not a
-- set: most chains have one task in a queue, which is then one `SET NX PX`, where a set
-- took an SADD and a PEXPIRE.
local CHAIN_PREFIX = '~c' .. string.match(K_REC, '{(.-)}') .. '.'
local function chain_name(seq)
  return CHAIN_PREFIX .. seq
end

local function chain_index(chain)
  return string.sub(K_REC, 1, -3) .. 'chain:' .. chain
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

-- Lists each of `ids` in the list of its chain (chains[i], '' none). (A member listed
-- twice, which only a migration run again can do, is read once.)
local function chain_index_add(ids, chains, ttl_ms)
  local keep = ttl_ms and ttl_ms > 0 and 2 * ttl_ms
  for i, id in ipairs(ids) do
    local g = chains[i]
    if g and g ~= '' then
      local key = chain_index(g)
      local made = keep and redis.call('SET', key, id, 'NX', 'PX', keep)
        or not keep and redis.call('SET', key, id, 'NX')
      if not made then
        redis.call('APPEND', key, FS .. id)
        if keep then redis.call('PEXPIRE', key, keep) end
      end
    end
  end
end

-- The running entry of a leased task (see above): "at FS attempt FS host FS slot FS".
local function run_key(id)
  return K_LEASED .. ':run:' .. id
end

-- The zset of the lists of ended tasks (see above), and one of those lists.
local K_ENDS = K_EXP .. ':b'
local function ends_list(member)
  return K_ENDS .. ':' .. member
end

-- Tasks acked as a whole batch lease (a slot's steady state) are done without a write to
-- their records. A tracked task's meta carries its record's sequence number (its score in
-- K_IDX, see records_new); the slot hands the batch's numbers back as runs s1..s2 of
-- consecutive ones, and the ack keeps each run once: the member
-- "s1 FS s2 FS expiry FS done-at FS entries" of the zset K_DONE scored by s1 (entries: the
-- running and done entries an APPEND per task would have written), and the member
-- 'r' .. s1 .. ':' .. s2 of K_ENDS scored by the expiry. A record that has not ended is
-- done by the run that holds its number (done_of). The number is the record's own: a new
-- task under an old id has a new one and is never read as done by the old task's run, and
-- a run's sweep finds its records in K_IDX by score (expire_run). An APPEND per task, with
-- the Lua around each call, was most of what tracking cost an ack; a hash from id to batch
-- instead cost as much in its inserts (a hash table of every finished task, growing).
local K_DONE = K_ENDS .. ':r'

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
local G_PAT = '^' .. string.rep('[^\30\31]*\31', NF - 1) .. '([^\30\31]*)\30'
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

-- ---------------------------------------------------------------------------------------
-- Packets (ARCHITECTURE.md, invariant 36). The follow-ups one enqueue call makes on a tracked
-- queue can be kept as one packet instead of a task and a record each: BASE (text) is the
-- call's record numbers less one, its n tasks are numbered BASE+1..BASE+n as any record,
-- and each has its entry in K_IDX (so listings and done_of find them as any task).
--   `K_REC .. '#p' .. BASE` (the store, which lives as long as a record of it does):
--     "pri FS max_attempts FS created FS due FS n FS BASE" RS FS id1 FS ... idn FS RS
--     "chain1 FS ... chainn" — what records_new would have written of each task;
--   the field `'#p' .. BASE` of K_PAYLOAD (its waiting part, while a task of it waits):
--     their count RS FS id FS ... FS (those still waiting, in order) RS their payloads,
--     each "LEN:bytes";
--   its entry `'#p' .. BASE` in its priority's ready list, in place of the ids;
--   K_PKTS: the live packets, member BASE scored by BASE + 1; K_PKTW: how many tasks the
--   packets' ready entries stand for beyond one each (ready_count).
-- No task id can start with "#p": ids a user gives cannot start with '#', generated ones
-- are '~g' and digits (before: '#' and digits), and a follow-up's is its parent's and
-- "~N". A task's record is read from its packet while it has no key of its own
-- (rec_get); whatever writes a record writes the whole of it, which gives the task its
-- key, and the key wins from then on.

-- Counts `d` more tasks in K_PKTW, which goes once it is 0 (a queue whose packets have
-- all been taken keeps no key for them).
local function packets_waiting_add(d)
  if d ~= 0 and redis.call('INCRBY', K_PKTW, d) == 0 then redis.call('DEL', K_PKTW) end
end

local function packet_store_key(base)
  return K_REC .. PACKET .. base
end

-- The i-th (from 1) of the `sep`-separated fields of `s` after position `from` (the
-- position of the separator before the first), and the end of it; nil past the last.
local function nth_field(s, sep, from, i)
  local pos = from
  for _ = 1, i - 1 do
    pos = string.find(s, sep, pos + 1, true)
    if not pos then return nil end
  end
  local stop = string.find(s, sep, pos + 1, true)
  return string.sub(s, pos + 1, (stop or (#s + 1)) - 1), stop
end

-- A packet store's parts: its shared fields as text (pri, ma, created, due), its count,
-- and the positions of the RS before its ids and before its chains.
local function packet_parts(v)
  local ids_at = string.find(v, RS, 1, true)
  local pri, ma, created, due, n = string.match(string.sub(v, 1, ids_at - 1),
    '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31(%d+)\31')
  local chains_at = string.find(v, RS, ids_at + 1, true)
  return pri, ma, created, due, tonumber(n), ids_at, chains_at
end

-- What the packet holding task number `seq` (a number), `id`, says of it: its shared
-- fields as text (pri, ma, created, due), its chain and the packet's BASE; nil when no
-- packet holds it.
local function packet_fields_at(id, seq)
  local b = redis.call('ZRANGE', K_PKTS, seq, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
  if not b then return nil end
  local v = redis.call('GET', packet_store_key(b))
  if not v then return nil end
  local pri, ma, created, due, n, ids_at, chains_at = packet_parts(v)
  local i = seq - tonumber(b)
  if i < 1 or i > n then return nil end
  -- (the ids block starts with FS: its i-th id is the (i+1)-th field after the RS)
  if nth_field(v, FS, ids_at + 1, i) ~= id then return nil end
  -- (the chains end at the next RS, should the store ever hold more parts)
  local chains = string.sub(v, chains_at, (string.find(v, RS, chains_at + 1, true) or (#v + 1)) - 1)
  return pri, ma, created, due, nth_field(chains, FS, 1, i) or '', b
end

-- The record of a packet's task as its enqueue would have written it (waiting;
-- rec_current adds what came after), from packet_fields_at.
local function packet_record_of(pri, ma, created, due, g)
  return pri .. FS .. ma .. FS .. created .. FS .. due .. FS .. 'chain:' .. g .. FS .. FS
    .. FS .. g .. RS .. entry('waiting', created, 0, '', '', '')
end

-- The meta of a packet's task as its enqueue would have written it (see parse_meta).
local function packet_meta_of(seq, pri, ma, created, g)
  return pri .. ':' .. ma .. ':' .. created .. '.' .. string.format('%d', seq) .. ':c' .. g
end

-- packet_record_of task number `seq`, `id`, or nil when no packet holds it.
local function packet_record_at(id, seq)
  local pri, ma, created, due, g = packet_fields_at(id, seq)
  return pri and packet_record_of(pri, ma, created, due, g) or nil
end

-- The stored record of `id`: its key's value, else (a task of a packet that no write has
-- touched yet) its packet's (packet_record), else nil. `cache`: a table kept for one
-- script (whether the queue has packets is read once).
local function packet_record(id, cache)
  if cache.no_packets == nil then cache.no_packets = redis.call('EXISTS', K_PKTS) == 0 end
  if cache.no_packets then return nil end
  local seq = redis.call('ZSCORE', K_IDX, id)
  return seq and packet_record_at(id, tonumber(seq)) or nil
end

local function rec_get(id, cache)
  return redis.call('GET', rec_key(id)) or packet_record(id, cache)
end

-- rec_get of many ids at once (false where there is none): their keys in `keys`.
local function rec_mget(ids, keys, cache)
  local vals = mget(keys)
  for i, id in ipairs(ids) do
    if not vals[i] then vals[i] = packet_record(id, cache) or false end
  end
  return vals
end

-- A packet's waiting part (or what a take of it handed out) as its count, the position of
-- the RS before its ids and the position of the RS before its payloads.
local function waiting_parts(v)
  local ids_at = string.find(v, RS, 1, true)
  local pays_at = string.find(v, RS, ids_at + 1, true)
  return tonumber(string.sub(v, 1, ids_at - 1)), ids_at, pays_at
end

-- The `n` payloads framed "LEN:bytes" one after another in `v` from position `from`,
-- as a table (the slot frames them so, see enqueue.rs).
local function framed_payloads(v, from, n)
  local out = {}
  for i = 1, n do
    local len = string.match(v, '^(%d+):', from)
    local start = from + #len + 1
    out[i] = string.sub(v, start, start + tonumber(len) - 1)
    from = start + tonumber(len)
  end
  return out
end

-- A waiting part's ids as a table, and the position of the RS before its payloads.
local function waiting_ids(v)
  local _, ids_at, pays_at = waiting_parts(v)
  local ids = {}
  for id in string.gmatch(string.sub(v, ids_at + 1, pays_at - 1), '[^\31]+') do
    ids[#ids + 1] = id
  end
  return ids, pays_at
end

-- A waiting part's ids and payloads as tables.
local function waiting_tasks(v)
  local ids, pays_at = waiting_ids(v)
  return ids, framed_payloads(v, pays_at + 1, #ids)
end

-- Makes ordinary tasks of packet tasks `ids` (their payloads in `payloads`): each gets its
-- field in K_PAYLOAD and, unless it has one, its record key, as a one-by-one enqueue
-- would have written them. Every path that handles such a task alone (a retry, a cancel,
-- an expiry) comes through here first, as a batch lease is split first.
local function packet_unpack(ids, payloads)
  if #ids == 0 then return end
  local seqs = redis.call('ZMSCORE', K_IDX, unpack(ids))
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  local have = mget(keys)
  local values, recs = {}, {}
  for i, id in ipairs(ids) do
    local seq = seqs[i] and tonumber(seqs[i])
    local pri, ma, created, due, g
    if seq then pri, ma, created, due, g = packet_fields_at(id, seq) end
    if pri then
      values[#values + 1] = id
      values[#values + 1] = packet_meta_of(seq, pri, ma, created, g) .. '\n' .. payloads[i]
      if not have[i] then
        recs[#recs + 1] = keys[i]
        recs[#recs + 1] = packet_record_of(pri, ma, created, due, g)
      end
    end
  end
  if #values > 0 then bulk('HSET', K_PAYLOAD, values) end
  if #recs > 0 then bulk('MSET', nil, recs) end
end

-- Writes the follow-ups `ids` (numbered base+1.. in K_IDX by the caller) as one packet
-- of priority `pri`: `chains` and `payloads` as the slot sent them (chains separated by
-- FS, payloads framed "LEN:bytes"). The shared fields are text already.
local function packet_write(base, ids, pri, ma, created, due, chains, payloads)
  local b = string.format('%d', base)
  local framed = FS .. table.concat(ids, FS) .. FS
  local name = PACKET .. b
  redis.call('SET', packet_store_key(b),
    pri .. FS .. ma .. FS .. created .. FS .. due .. FS .. #ids .. FS .. b .. RS .. framed .. RS
      .. chains)
  redis.call('HSET', K_PAYLOAD, name, #ids .. RS .. framed .. RS .. payloads, '', PIN)
  redis.call('ZADD', K_PKTS, base + 1, b)
  packets_waiting_add(#ids - 1)
  push_ready(tonumber(pri), {name}, false)
end

-- Records one transition of a tracked task: new history entry and the fields in `set`
-- (a table field name → value). A nil `attempt` keeps the last entry's; a nil `host`
-- takes host and slot from the last entry (a lease that expired names the slot that lost
-- it). `ttl_ms` > 0: the task ended. Returns false when the task has no record.
local function record(id, state, now, attempt, host, slot, note, set, ttl_ms)
  local run = redis.call('GET', run_key(id))
  if run then redis.call('DEL', run_key(id)) end
  local key = rec_key(id)
  local v = rec_get(id, {})
  if not v then return false end
  local f, hist = rec_parse(v)
  if run then hist = hist .. RS .. 'running' .. FS .. run end
  if attempt == nil or host == nil then
    local _, _, _, latt, lhost, lslot = last_entry(hist)
    if attempt == nil then attempt = latt or 0 end
    if host == nil then host, slot = lhost or '', lslot or '' end
  end
  if set then
    for k, val in pairs(set) do f[F[k]] = (k == 'e') and clean(val) or val end
  end
  redis.call('SET', key, rec_pack(f, history_add(hist, state, now, attempt, host, slot, note)))
  if ttl_ms and ttl_ms > 0 then
    ended(id, now, ttl_ms)
  else
    -- alive again (a requeued dead letter): it must not expire meanwhile
    redis.call('ZREM', K_EXP, id)
  end
  return true
end

-- A take's running entries for its batch, kept beside the records until each attempt
-- ends: one command for the batch. `attempts` is a table by position.
local function run_begin(ids, now, attempts, host, slot)
  if #ids == 0 then return end
  -- One value per attempt number, built once: turning a number into text costs Lua a
  -- printf, which per task was a good part of the records' cost.
  local tail = FS .. host .. FS .. slot .. FS
  local by_attempt, kv = {}, {}
  for k, id in ipairs(ids) do
    local a = attempts[k]
    local v = by_attempt[a]
    if not v then
      v = now .. FS .. a .. tail
      by_attempt[a] = v
    end
    kv[2 * k - 1] = run_key(id)
    kv[2 * k] = v
  end
  bulk('MSET', nil, kv)
end

-- The watchers among `ids` (an api instance's sync submits) are told that they ended.
local function tell_watchers(ids)
  if redis.call('EXISTS', K_WATCH) == 0 then return end
  local i = 1
  while i <= #ids do
    local j = math.min(i + CHUNK - 1, #ids)
    local w = redis.call('SMISMEMBER', K_WATCH, unpack(ids, i, j))
    for x = 1, #w do
      if w[x] == 1 then
        redis.call('SREM', K_WATCH, ids[i + x - 1])
        redis.call('PUBLISH', ENDED_CHANNEL, ids[i + x - 1])
      end
    end
    i = j + 1
  end
end

-- The record TTLs the lists of K_ENDS were made with, "TTL,TTL,…" in K_CONF 'ends_ttls'
-- (few: one per `history_ttl` the queue had): a list is known by its end moment, and
-- two lists of one moment made with different TTLs (a `history_ttl` changed while slots
-- of the old and the new config ack) must not make each other's records due early
-- (due_end_moments).
local function ends_ttl_known(ttl_ms)
  local known = redis.call('HGET', K_CONF, 'ends_ttls') or ''
  local t = string.format('%d', ttl_ms)
  if not string.find(',' .. known .. ',', ',' .. t .. ',', 1, true) then
    redis.call('HSET', K_CONF, 'ends_ttls', known == '' and t or (known .. ',' .. t))
  end
end

-- The ack's transition for many tasks at once: per task one APPEND of its running entry
-- (without its state) and its done entry, nothing read; the records then expire `ttl_ms`
-- from now, and whoever waits for one is told. `runs`: the running entries by position
-- (nil where there is none), or one string for all; `attempts`: by position, or one
-- number for all.
local function records_done(ids, runs, now, attempts, host, slot, ttl_ms)
  if #ids == 0 then return end
  local packets = {}
  local head, tail = RS .. 'done' .. FS .. now .. FS, FS .. host .. FS .. slot .. FS
  local same_run = type(runs) == 'string'
  local same_att = type(attempts) == 'number'
  local by_attempt = {}
  for k, id in ipairs(ids) do
    local a = same_att and attempts or attempts[k]
    local e = by_attempt[a]
    if not e then
      e = head .. a .. tail
      if same_run then e = RS .. 'running' .. FS .. runs .. e end
      by_attempt[a] = e
    end
    if not same_run then
      local r = runs[k]
      if r then e = RS .. 'running' .. FS .. r .. e end
    end
    -- A task enqueued before its queue tracked has no record, and must not get half of
    -- one: APPEND has created the key exactly when the result is only what it appended.
    -- A packet's task has its record in its packet: it gets that, with the entries.
    local key = rec_key(id)
    if redis.call('APPEND', key, e) == #e then
      local kept = packet_record(id, packets)
      if kept then
        redis.call('SET', key, kept .. e)
      else
        redis.call('DEL', key)
      end
    end
  end
  local member = (now + ttl_ms) .. ':' .. ttl_ms
  bulk('RPUSH', ends_list(member), ids)
  redis.call('ZADD', K_ENDS, now + ttl_ms, member)
  ends_ttl_known(ttl_ms)
  tell_watchers(ids)
end

-- The runs of sequence numbers "s1-s2,s3-s4,..." a slot sent for the `k` tasks of a
-- batch it acked whole, as a table of {s1, s2} (text); nil unless they are `k` distinct
-- numbers (then the ack writes each record, as for tasks that have no number).
local function done_runs(spec, k)
  local runs, total = {}, 0
  for a, b in string.gmatch(spec, '(%d+)%-(%d+)') do
    local n = tonumber(b) - tonumber(a) + 1
    if n < 1 then return nil end
    total = total + n
    runs[#runs + 1] = {a, b}
  end
  if total ~= k or #runs == 0 then return nil end
  -- (a batch taken out of number order has a few runs: they must not overlap)
  if #runs > 1 then
    local by = {}
    for i, r in ipairs(runs) do by[i] = {tonumber(r[1]), tonumber(r[2])} end
    table.sort(by, function(x, y) return x[1] < y[1] end)
    for i = 2, #by do
      if by[i][1] <= by[i - 1][2] then return nil end
    end
  end
  return runs
end

-- The ack of a whole batch lease whose tasks' numbers are `runs` (done_runs), taken at `at`
-- by thost/tslot: done at `now` by host/slot, the records expire `ttl_ms` later. Writes no
-- record (see K_DONE).
local function records_done_runs(runs, at, thost, tslot, now, host, slot, ttl_ms)
  local exp = string.format('%d', now + ttl_ms)
  local tail = FS .. exp .. FS .. now .. FS
    .. RS .. 'running' .. FS .. at .. FS .. '1' .. FS .. thost .. FS .. tslot .. FS
    .. RS .. 'done' .. FS .. now .. FS .. '1' .. FS .. host .. FS .. slot .. FS
  local z, e = {}, {}
  for i, r in ipairs(runs) do
    z[2 * i - 1] = r[1]
    z[2 * i] = r[1] .. FS .. r[2] .. tail
    e[2 * i - 1] = exp
    e[2 * i] = 'r' .. r[1] .. ':' .. r[2]
  end
  bulk('ZADD', K_DONE, z)
  bulk('ZADD', K_ENDS, e)
end

-- The ack's transition for tasks leased one by one: their running entries are read and
-- removed. `attempts` is a table by position.
local function record_done_many(ids, now, attempts, host, slot, ttl_ms)
  if #ids == 0 then return end
  local keys = {}
  for k, id in ipairs(ids) do keys[k] = run_key(id) end
  records_done(ids, mget(keys), now, attempts, host, slot, ttl_ms)
  bulk('DEL', nil, keys)
end

-- Removes the running entries of tasks whose attempt ended.
local function run_end(ids)
  if #ids == 0 then return end
  local keys = {}
  for k, id in ipairs(ids) do keys[k] = run_key(id) end
  bulk('DEL', nil, keys)
end

-- ---------------------------------------------------------------------------------------
-- Batch leases. A take whose tasks are all at their first attempt (the common case) leases
-- them as one: the member `tok` of K_BATCHES, scored by the expiry, and the string
-- `batch_key(tok)` = "at FS host FS slot FS count RS FS id1 FS id2 ... FS" (the taker, and
-- the ids in take order). A settle that acks exactly that batch (a slot's steady state)
-- checks it with one comparison and removes it whole, where per-task leases cost a zset
-- entry per task made, moved and removed (with the running entries of tracked tasks, two
-- thirds of Redis's work per task beyond the payload). Every other path that touches one of
-- its tasks (a retry, fail or extend, a partial or stale ack, a release, a cancel, an
-- expiry) first splits it: per-task leases `tok:id` of K_LEASED with the same expiry and,
-- when the queue tracks, their running entries, exactly as a take made them before; then
-- goes on as before. K_BATCHN counts the tasks in batch leases (stats). Ids holding FS or RS
-- (allowed, and rare) are leased per task.
local K_BATCHES = K_LEASED .. ':b'
local K_BATCHN = K_LEASED .. ':bn'

local function batch_key(tok)
  return K_BATCHES .. ':' .. tok
end

-- Leases the `n` ids of `framed` (FS id FS … FS, all at their first attempt, none
-- holding a separator) as batch `tok`, expiring at `exp_s` (text).
local function batch_lease_framed(tok, exp_s, n, framed, now, host, slot)
  redis.call('ZADD', K_BATCHES, exp_s, tok)
  redis.call('SET', batch_key(tok), now .. FS .. host .. FS .. slot .. FS .. n .. RS .. framed)
  redis.call('INCRBY', K_BATCHN, n)
end

-- Leases `ids` (all at their first attempt) as batch `tok`, unless an id holds a
-- separator: then returns false and the caller leases them per task.
local function batch_lease(tok, exp_s, ids, now, host, slot)
  if string.find(table.concat(ids), '[\30\31]') then return false end
  batch_lease_framed(tok, exp_s, #ids, FS .. table.concat(ids, FS) .. FS, now, host, slot)
  return true
end

-- A batch's value as its taker (at, host, slot), its count and its ids framed by FS.
local function batch_parts(v)
  local cut = string.find(v, RS, 1, true)
  local at, host, slot, n = string.match(string.sub(v, 1, cut - 1),
    '^([^\31]*)\31([^\31]*)\31([^\31]*)\31(%d+)$')
  return at, host, slot, tonumber(n), string.sub(v, cut + 1)
end

local function batch_gone(tok, n)
  redis.call('ZREM', K_BATCHES, tok)
  -- (with what a take of a packet kept of its tasks, see packet_take)
  redis.call('DEL', batch_key(tok), batch_key(tok) .. ':p')
  redis.call('INCRBY', K_BATCHN, -n)
end

-- Turns batch `tok` into per-task leases with its expiry (and their running entries when
-- the queue tracks). Returns how many tasks it held (0: there is no such batch).
local function batch_split(tok)
  local v = redis.call('GET', batch_key(tok))
  if not v then return 0 end
  local exp = redis.call('ZSCORE', K_BATCHES, tok) or '0'
  local at, host, slot, n, framed = batch_parts(v)
  -- a take of a packet: its tasks become ordinary ones first
  local taken = redis.call('GET', batch_key(tok) .. ':p')
  if taken then packet_unpack(waiting_tasks(taken)) end
  local ids, z, ones = {}, {}, {}
  for id in string.gmatch(framed, '\31([^\31]+)') do
    local i = #ids + 1
    ids[i] = id
    z[2 * i - 1] = exp
    z[2 * i] = tok .. ':' .. id
    ones[i] = 1
  end
  bulk('ZADD', K_LEASED, z)
  if redis.call('EXISTS', K_IDX) == 1 then run_begin(ids, at, ones, host, slot) end
  batch_gone(tok, n)
  return n
end

-- Hands out up to `n` tasks of packet `name`, whose entry heads ready list `list`, as
-- batch lease `tok` (text; `exp_s` its expiry, as text): all of them when they are at
-- most `n` (the entry goes), else the first `n` (the entry stays for the rest). What was
-- taken is kept beside the batch (`batch_key(tok) .. ':p'`, a waiting part) until the
-- batch goes whole or is split. Returns the packet's store and what was taken, for the
-- slot to make each task of (lease.rs); nil when the packet is gone (its entry goes).
local function packet_take(list, name, n, tok, exp_s, now, host, slot)
  local v = redis.call('HGET', K_PAYLOAD, name)
  local store = redis.call('GET', packet_store_key(string.sub(name, #PACKET + 1)))
  if not (v and store) then
    redis.call('LREM', list, 1, name)
    return nil
  end
  local k, ids_at, pays_at = waiting_parts(v)
  local taken = v
  if k <= n then
    redis.call('LPOP', list)
    redis.call('HDEL', K_PAYLOAD, name)
    packets_waiting_add(1 - k)
  else
    -- the first n ids (up to the FS after the n-th) and the first n payloads
    local cut = ids_at + 1
    for _ = 1, n do cut = string.find(v, FS, cut + 1, true) end
    local from = pays_at + 1
    for _ = 1, n do
      local len = string.match(v, '^(%d+):', from)
      from = from + #len + 1 + tonumber(len)
    end
    taken = n .. RS .. string.sub(v, ids_at + 1, cut) .. RS .. string.sub(v, pays_at + 1, from - 1)
    redis.call('HSET', K_PAYLOAD, name,
      (k - n) .. RS .. string.sub(v, cut, pays_at - 1) .. RS .. string.sub(v, from))
    packets_waiting_add(-n)
    k = n
  end
  local _, t_ids, t_pays = waiting_parts(taken)
  batch_lease_framed(tok, exp_s, k, string.sub(taken, t_ids + 1, t_pays - 1), now, host, slot)
  redis.call('SET', batch_key(tok) .. ':p', taken)
  return store, taken
end

-- Splits every batch named in `toks` (tokens as text; repeats are fine).
local function batches_split(toks)
  if redis.call('EXISTS', K_BATCHES) == 0 then return end
  local seen = {}
  for _, t in ipairs(toks) do
    if not seen[t] then
      seen[t] = true
      batch_split(t)
    end
  end
end

-- When args[first..last] are exactly batch `tok`'s ids in take order, removes the batch
-- and returns its taker (at, host, slot): the whole batch is acked. Else nil, and nothing
-- changed.
local function batch_ack_whole(tok, args, first, last)
  local v = redis.call('GET', batch_key(tok))
  if not v then return nil end
  local at, host, slot, n, framed = batch_parts(v)
  if n ~= last - first + 1 then return nil end
  if framed ~= FS .. table.concat(args, FS, first, last) .. FS then return nil end
  batch_gone(tok, n)
  return at, host, slot
end

-- The batch holding `id`, as its token and value; O(tasks in batch leases), for admin
-- paths and readers only.
local function batch_of(id)
  if redis.call('EXISTS', K_BATCHES) == 0 then return nil end
  local probe = FS .. id .. FS
  for _, tok in ipairs(redis.call('ZRANGE', K_BATCHES, 0, -1)) do
    local v = redis.call('GET', batch_key(tok))
    if v and string.find(v, probe, string.find(v, RS, 1, true), true) then return tok, v end
  end
  return nil
end

-- The running entry ("at FS attempt FS host FS slot FS") of a task in a batch lease, or
-- nil. O(batches in flight): one read looks until it finds the task; a script reading
-- many records (`cache.many` set) reads every batch once and keeps each of their tasks'
-- entries by id in `cache`, so that a page of records costs the tasks in flight once, not
-- once per record (a listing of a queue with thousands of tasks in batch leases did).
local function batch_run_of(id, cache)
  if not cache.many then
    local _, v = batch_of(id)
    if not v then return nil end
    local at, host, slot = batch_parts(v)
    return at .. FS .. '1' .. FS .. host .. FS .. slot .. FS
  end
  if not cache.runs then
    cache.runs = {}
    if redis.call('EXISTS', K_BATCHES) == 1 then
      for _, tok in ipairs(redis.call('ZRANGE', K_BATCHES, 0, -1)) do
        local v = redis.call('GET', batch_key(tok))
        if v then
          local at, host, slot, _, framed = batch_parts(v)
          local entry = at .. FS .. '1' .. FS .. host .. FS .. slot .. FS
          for each in string.gmatch(framed, '[^\31]+') do cache.runs[each] = entry end
        end
      end
    end
  end
  return cache.runs[id]
end

-- Whether lease `tok` of task `id` still stands in the queue whose per-task leases are
-- the zset `leased` (K_LEASED of this queue or, on one server, of another): its batch lease
-- not split, or its own lease, expired or not (a settle still takes one nobody reclaimed).
-- A cancel removes it. `whole` keeps per token whether its batch is whole, for one call.
local function lease_stands(leased, tok, id, whole)
  if whole[tok] == nil then
    whole[tok] = redis.call('EXISTS', leased .. ':b:' .. tok) == 1
  end
  return whole[tok] or redis.call('ZSCORE', leased, tok .. ':' .. id) ~= false
end

-- When the next lease runs out, per task or batch (ms, Redis clock), or nil when none is held.
local function earliest_lease()
  local first
  for _, z in ipairs({K_LEASED, K_BATCHES}) do
    local l = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    if l[2] and (not first or tonumber(l[2]) < first) then first = tonumber(l[2]) end
  end
  return first
end

local function glob_escape(s)
  return (string.gsub(s, '([%*%?%[%]\\])', '\\%1'))
end

-- Takes waiting task `id` out of packet `name` (its waiting part `v`, priority `pri`) and
-- makes it an ordinary ready task in the packet's place in its list (before its entry),
-- for a path that handles it alone (a cancel). O(the packet and the list before it).
local function packet_unpack_waiting(id, name, v, pri)
  local ids, payloads = waiting_tasks(v)
  local rest_ids, rest = {}, {}
  local payload
  for i, w in ipairs(ids) do
    if w == id then
      payload = payloads[i]
    else
      rest_ids[#rest_ids + 1] = w
      rest[#rest + 1] = #payloads[i] .. ':' .. payloads[i]
    end
  end
  if not payload then return end
  local list = ready_list(pri)
  if redis.call('LINSERT', list, 'BEFORE', name, id) < 0 then push_ready(pri, {id}, false) end
  if #rest_ids == 0 then
    redis.call('HDEL', K_PAYLOAD, name)
    redis.call('LREM', list, 1, name)
  else
    redis.call('HSET', K_PAYLOAD, name, #rest_ids .. RS .. FS .. table.concat(rest_ids, FS) .. FS
      .. RS .. table.concat(rest))
    packets_waiting_add(-1)
  end
  packet_unpack({id}, {payload})
end

-- A packet's task that is still to run, from its packet: 'waiting' (in the packet's
-- waiting part) or 'leased' (in a batch lease a take of it made), its meta and its
-- payload; nil when no packet holds it or it ran. With `unpack`, a waiting one is made an
-- ordinary ready task first (packet_unpack_waiting). Reads O(the packet), and for a task
-- not waiting O(batches in flight): for admin paths and readers only.
local function packet_alive(id, unpack_it)
  if redis.call('EXISTS', K_PKTS) == 0 then return nil end
  local seq = tonumber(redis.call('ZSCORE', K_IDX, id))
  if not seq then return nil end
  local pri, ma, created, _, g, b = packet_fields_at(id, seq)
  if not pri then return nil end
  local m = packet_meta_of(seq, pri, ma, created, g)
  local name = PACKET .. b
  local v = redis.call('HGET', K_PAYLOAD, name)
  local where, found = nil, v
  -- (among the ids: a payload may hold any bytes)
  local waits = false
  if v then
    local _, ids_at, pays_at = waiting_parts(v)
    local at = string.find(v, FS .. id .. FS, ids_at, true)
    waits = at ~= nil and at < pays_at
  end
  if not waits then
    local tok = batch_of(id)
    found = tok and redis.call('GET', batch_key(tok) .. ':p')
    where = 'leased'
  else
    where = 'waiting'
  end
  if not found then return nil end
  local ids, payloads = waiting_tasks(found)
  for i, w in ipairs(ids) do
    if w == id then
      if unpack_it and where == 'waiting' then packet_unpack_waiting(id, name, v, tonumber(pri)) end
      return where, m, payloads[i]
    end
  end
  return nil
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
  local tok = batch_of(id)
  if not tok then return nil end
  local exp = tonumber(redis.call('ZSCORE', K_BATCHES, tok))
  if split then batch_split(tok) end
  return tok .. ':' .. id, exp, tok
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


-- The submitter field of a stored record, without parsing the rest.
local function rec_submitter(v)
  local pos = 1
  for _ = 1, F.b - 1 do
    pos = string.find(v, FS, pos, true)
    if not pos then return '' end
    pos = pos + 1
  end
  local j = string.find(v, FS, pos, true)
  return string.sub(v, pos, (j or pos) - 1)
end

-- Whether the record of `id` names `owner` as its submitter ('' : anyone's, no read).
local function rec_owned_by(id, owner)
  if owner == '' then return true end
  local v = rec_get(id, {})
  return v and rec_submitter(v) == owner
end

-- Takes `ids` out of the submitter indexes their records `vals` (false: none) name,
-- except `keep`'s.
local function submitters_unindex(ids, vals, keep)
  local by = {}
  for i, id in ipairs(ids) do
    local b = vals[i] and rec_submitter(vals[i]) or ''
    if b ~= '' and b ~= keep then
      by[b] = by[b] or {}
      table.insert(by[b], id)
    end
  end
  for b, bids in pairs(by) do bulk('ZREM', submitter_index(b), bids) end
end

-- The packets (BASE → n, see "Packets") holding records of `ids`, before their index
-- entries go.
local function packets_of(ids)
  local out = {}
  local seqs = {}
  for i = 1, #ids, CHUNK do
    for _, q in ipairs(redis.call('ZMSCORE', K_IDX, unpack(ids, i, math.min(i + CHUNK - 1, #ids)))) do
      seqs[#seqs + 1] = q
    end
  end
  for _, q in ipairs(seqs) do
    if q then
      local b = redis.call('ZRANGE', K_PKTS, q, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
      if b and not out[b] then
        local v = redis.call('GET', packet_store_key(b))
        local n = v and select(5, packet_parts(v))
        if n and tonumber(q) <= tonumber(b) + n then out[b] = n end
      end
    end
  end
  return out
end

-- Deletes the stores of `packets` (packets_of) none of whose records is left: a packet
-- lives as long as the last record read from it.
local function packets_forget_empty(packets)
  for b, n in pairs(packets) do
    if redis.call('ZCOUNT', K_IDX, tonumber(b) + 1, tonumber(b) + n) == 0 then
      redis.call('DEL', packet_store_key(b))
      redis.call('ZREM', K_PKTS, b)
    end
  end
end

-- Deletes the records of `ids` (their stored values in `vals`) with their index entries,
-- so the indexes never hold more than the records.
local function rec_delete(ids, vals)
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  submitters_unindex(ids, vals, '')
  local packets = redis.call('EXISTS', K_PKTS) == 1 and packets_of(ids)
  bulk('ZREM', K_IDX, ids)
  bulk('DEL', nil, keys)
  if packets then packets_forget_empty(packets) end
end

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

-- Expires the run of tasks s1..s2 (text) done together (see K_DONE), whole: the records
-- whose numbers it holds go. Returns how many there were.
local function expire_run(s1, s2)
  redis.call('ZREM', K_ENDS, 'r' .. s1 .. ':' .. s2)
  -- (by member: an ACL written before ZREMRANGEBYSCORE was needed refuses it)
  bulk('ZREM', K_DONE, redis.call('ZRANGEBYSCORE', K_DONE, s1, s1))
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
    local s1, s2 = string.match(member, '^r(%d+):(%d+)$')
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
  -- The oldest packet goes once none of its records is left, however they went: every
  -- id of it may since hold a new task (numbered anew), whose record's end never looks
  -- at the packet. One look per sweep; the oldest one lives least long.
  if n < limit and redis.call('EXISTS', K_PKTS) == 1 then
    local b = redis.call('ZRANGE', K_PKTS, 0, 0)[1]
    local v = b and redis.call('GET', packet_store_key(b))
    packets_forget_empty({[b] = v and select(5, packet_parts(v)) or 0})
  end
  return n
end

-- The run whose ack ended task `id` (see K_DONE) as {expiry, done at, its history
-- entries}, or false. `cache`: a table kept for one script, where each id is looked up
-- once (a reader asks rec_visible, then rec_current).
local function done_of(id, cache)
  if cache.no_runs == nil then
    cache.no_runs = redis.call('EXISTS', K_DONE) == 0
    cache.runs_of = {}
  end
  if cache.no_runs then return false end
  local d = cache.runs_of[id]
  if d ~= nil then return d end
  d = false
  local seq = redis.call('ZSCORE', K_IDX, id)
  local m = seq and redis.call('ZRANGE', K_DONE, seq, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)[1]
  if m then
    local s2, exp, at, entries = string.match(m, '^%d+\31(%d+)\31(%d+)\31(%d+)\31(.*)$')
    if s2 and tonumber(seq) <= tonumber(s2) then d = {tonumber(exp), at, entries} end
  end
  cache.runs_of[id] = d
  return d
end

-- The value (a meta and an empty payload) standing for a packet's task that has not
-- ended, for a caller that asks whether task `id`, which has no field in K_PAYLOAD,
-- exists: a task of a packet that has no field waits in the packet, is in a take's batch
-- lease, or ended, which its record says (a cancel or failure wrote it) or else the run of
-- its batch's ack (done_of). Its record may have a key while it waits (a pause's note
-- wrote it). nil for any other id.
local function packet_value(id, cache)
  if cache.no_packets == nil then cache.no_packets = redis.call('EXISTS', K_PKTS) == 0 end
  if cache.no_packets then return nil end
  local v = redis.call('GET', rec_key(id))
  if v and is_end_state(select(2, last_entry(v))) then return nil end
  local seq = tonumber(redis.call('ZSCORE', K_IDX, id))
  local pri, ma, created, _, g
  if seq then pri, ma, created, _, g = packet_fields_at(id, seq) end
  if not pri or done_of(id, cache) then return nil end
  return packet_meta_of(seq, pri, ma, created, g) .. '\n'
end

-- The moments of the lists of records ended together whose time is up (expire_batched),
-- as a set. It costs one read of the due, not yet swept lists, which the sweeps of takes
-- and the manager's housekeeping keep few; a read fetches it once, and only when a record
-- needs it.
local function due_end_moments(now)
  local set, ttls = {}, nil
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', K_ENDS, '-inf', now)) do
    local exp, ttl = string.match(member, '^(%d+):(%d+)$')
    local at = exp and tonumber(exp) - tonumber(ttl)
    if at and set[at] == nil then
      -- A list of the same moment made with another TTL and not due yet holds records
      -- that are not due either (ended at the same moment, a longer life): the moment is
      -- shown until it is due too, and its due list's own records go with the sweep.
      if not ttls then
        ttls = {}
        for t in string.gmatch(redis.call('HGET', K_CONF, 'ends_ttls') or '', '%d+') do
          ttls[#ttls + 1] = tonumber(t)
        end
      end
      local due = true
      for _, t in ipairs(ttls) do
        if t ~= tonumber(ttl) then
          local other = redis.call('ZSCORE', K_ENDS, string.format('%d:%d', at + t, t))
          if other and tonumber(other) > now then due = false end
        end
      end
      set[at] = due
    end
  end
  return set
end

-- What readers see of the record of `id`, writing nothing (so a read-only Redis user can
-- read): its stored value, or nil when it has none or its time is up though no sweep has
-- deleted it yet. Due as the sweep decides: by its own moment in K_EXP when it ended
-- alone (a task alive again has none there); else when it ended with a batch whose list
-- is due, and such a batch's ack wrote the end entry at the list's moment
-- (record_done_many), so its last entry ends exactly at a due moment; or, done by a batch
-- ack that wrote nothing to it, when its run is due (done_of). `due` holds what one
-- script has read of these (a table, filled on first use; pass it on to rec_current).
local function rec_visible_value(id, v, now, due)
  local exp = redis.call('ZSCORE', K_EXP, id)
  if exp then
    if tonumber(exp) <= now then return nil end
    return v
  end
  local _, st, at = last_entry(v)
  if is_end_state(st) then
    if not due.moments then due.moments = due_end_moments(now) end
    if due.moments[tonumber(at)] then return nil end
  else
    local d = done_of(id, due)
    if d and d[1] <= now then return nil end
  end
  return v
end

-- rec_visible_value of the record of `id` as stored (nil: none).
local function rec_visible(id, now, due)
  local v = rec_get(id, due)
  if not v then return nil end
  return rec_visible_value(id, v, now, due)
end

-- The record `v` of `id` unless its time is up, by the same rule readers see it by
-- (rec_visible: its own moment, its batch's list's or its run's); one whose time is up
-- is deleted now rather than at the next sweep, so a dedup never counts a record no
-- reader would show. `due` as for rec_visible.
local function rec_live(id, v, now, due)
  if rec_visible_value(id, v, now, due) then return v end
  rec_delete({id}, {v})
  redis.call('ZREM', K_EXP, id)
  return nil
end

-- A record as readers get it: {s, p, a, m, c, d, u, b, e, r, g} (state, attempt and
-- updated time from its last entry) and its history.
local REC_VIEW_FIELDS = 11
local function rec_view(v)
  local f, hist = rec_parse(v)
  local _, st, at, att = last_entry(hist)
  return {st or '', f[F.p], att or '0', f[F.m], f[F.c], f[F.d], at or f[F.c], f[F.b], f[F.e], f[F.r], f[F.g]}, hist
end

-- A live record as readers see it (rec_view), with the entries of a batch ack that wrote
-- nothing to it (done_of), or the running entry of a task a slot holds now added from its
-- running entry, or from its batch lease (`cache`: a table kept for one script, see
-- done_of and batch_run_of).
local function rec_current(id, v, cache)
  local out, hist = rec_view(v)
  if not is_end_state(out[1]) then
    local d = done_of(id, cache)
    if d then
      out[1], out[3], out[7] = 'done', '1', d[2]
      return out, hist .. d[3]
    end
  end
  local run = redis.call('GET', run_key(id))
  if not run and not is_end_state(out[1]) then run = batch_run_of(id, cache) end
  if run then
    local at, att = string.match(run, '^([^\31]*)\31([^\31]*)\31')
    out[1], out[3], out[7] = 'running', att, at
    hist = hist .. RS .. 'running' .. FS .. run
  end
  return out, hist
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
-- score and a cursor is a score. Entries leave with their records (expire_records).

-- Creates the records of new tasks (all with the same options) and indexes them. An old
-- finished record with the same id is replaced. `ttl_ms` > 0: they end at once.
-- `chains`: nil, or per task its chain ('' for none); `roots`: whether the tasks are the
-- global tasks of their chains, else a follow-up shows `chain:G` as its submitter and is
-- left out of the submitter indexes (they would grow by one per chain). `keys`: nil, or the records' keys, made already.
-- `olds`: nil, or per task the record its id had (false: none): a task that ended under
-- the id leaves its submitter's index, which would otherwise list the new task to that
-- submitter (and keep the entry after the new record goes).
local function records_new(ids, seqs, state, now, pri, ma, due, by, note, ttl_ms, given, chains, roots, keys, olds)
  local first = entry(state, now, 0, '', '', note)
  -- The fields all tasks share, turned into text once: a number made text costs Lua a
  -- printf, which per task is a good part of an enqueue.
  local head = pri .. FS .. ma .. FS .. now .. FS .. due .. FS
  local tail = FS .. FS .. FS
  local v = head .. by .. tail .. RS .. first
  local scored, kv = {}, {}
  for i, id in ipairs(ids) do
    kv[2 * i - 1] = keys and keys[i] or rec_key(id)
    local g = chains and chains[i] or ''
    if g == '' then
      kv[2 * i] = v
    elseif roots then
      kv[2 * i] = head .. by .. tail .. g .. RS .. first
    else
      kv[2 * i] = head .. 'chain:' .. g .. tail .. g .. RS .. first
    end
    scored[2 * i - 1] = seqs[i]
    scored[2 * i] = id
  end
  bulk('MSET', nil, kv)
  if ttl_ms and ttl_ms > 0 then
    local exp = {}
    for i, id in ipairs(ids) do
      exp[2 * i - 1] = now + ttl_ms
      exp[2 * i] = id
    end
    bulk('ZADD', K_EXP, exp)
  elseif given then
    -- a new task under the id of an ended one must not expire with it
    bulk('ZREM', K_EXP, ids)
  end
  bulk('ZADD', K_IDX, scored)
  if by ~= '' then
    bulk('ZADD', submitter_index(by), scored)
    -- so that dropping the queue finds every submitter's index
    redis.call('HSET', K_CONF, 'by:' .. by, 1)
  end
  if olds then submitters_unindex(ids, olds, by) end
end

-- The system switch of the queue: state ('active' | 'paused' | 'disabled') and system
-- name, set at run time by `gaffer system NAME …` in K_CONF; nil when none was set.
local function system_switch()
  local v = redis.call('HGET', K_CONF, 'system')
  if not v then return nil end
  return string.match(v, '^(%a+):(.*)$')
end

-- An ordered queue's retried head (K_CONF 'head', set by settle) back at the front of its
-- list once due; forgotten once it is no longer delayed (taken, cancelled, ready).
local function ordered_head_due(now)
  local head = redis.call('HGET', K_CONF, 'head')
  if not head then return end
  local due = redis.call('ZSCORE', K_DELAYED, head)
  if due and tonumber(due) > now then return end
  if due then
    redis.call('ZREM', K_DELAYED, head)
    local m = meta_of(head)
    if m then push_ready(parse_meta(m), {head}, true) end
  end
  redis.call('HDEL', K_CONF, 'head')
end

-- Whether a take must hand out nothing, and the hint for the idle taker: a paused or
-- disabled system (hint -1: its resume wakes takers), or, on an ordered queue, a requeue
-- of dead letters to its front with chunks to come (dead_move.lua; hint: when that hold
-- runs out, and its last chunk wakes takers), a lease in flight (hint: its expiry) or a
-- retried head not yet due (hint: its due time).
local function take_hold(now, configured, ordered)
  local state = system_switch() or configured
  if state == 'paused' or state == 'disabled' then return true, -1 end
  if not ordered then return false end
  local requeuing = tonumber(redis.call('HGET', K_CONF, 'requeuing'))
  if requeuing and requeuing > now then return true, requeuing - now end
  local lease = earliest_lease()
  if lease then return true, math.max(0, lease - now) end
  local head = redis.call('HGET', K_CONF, 'head')
  local due = head and redis.call('ZSCORE', K_DELAYED, head)
  if due then return true, math.max(0, tonumber(due) - now) end
  return false
end

-- ---------------------------------------------------------------------------------------
-- Long tasks (kind = "long", see long.lua). A cancel asked of a running one is kept in
-- K_CANCEL, id → note (who asked), until the task ends: its slot, which sees it at its
-- next renewal, stops the task and ends it cancelled, or its lease runs out (take).
local K_CANCEL = K_LEASED .. ':cancel'

-- Ends a leased long task whose cancel was asked: lease, task and cancel go, the record
-- says cancelled with the asker's note. A nil attempt or host: the record's last ones.
local function cancel_end(id, member, now, attempt, host, slot, ttl_ms)
  local note = redis.call('HGET', K_CANCEL, id) or ''
  redis.call('HDEL', K_CANCEL, id)
  redis.call('ZREM', K_LEASED, member)
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
  record(id, 'cancelled', now, attempt, host, slot, note, nil, ttl_ms)
end

-- Of expired lease members, ends those of long tasks whose cancel was asked (their slot
-- died before it could) and returns the others, which come back as usual.
local function end_expired_cancels(expired, now, ttl_ms)
  if redis.call('EXISTS', K_CANCEL) == 0 then return expired end
  local rest = {}
  for _, member in ipairs(expired) do
    local id = lease_parts(member)
    if redis.call('HEXISTS', K_CANCEL, id) == 1 then
      cancel_end(id, member, now, nil, nil, nil, ttl_ms)
    else
      rest[#rest + 1] = member
    end
  end
  return rest
end
