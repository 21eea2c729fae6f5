-- Blocks: what a task's state is when it is not a key of its own. Three forms, each below
-- with its layout: packets (the follow-ups of one call kept as one), runs (the records of
-- a batch acked whole, kept once in K_DONE) and batch leases (a take's tasks leased as
-- one). This file is the only one that knows their keys (K_PKTS, K_PKTW, K_DONE,
-- K_BATCHES, K_BATCHN, the packet and batch keys, a packet's ready entry): the rest of the
-- library asks the functions of "The blocks' interface" at the end and those named in
-- each section, and `the_block_keys_are_known_only_to_blocks_lua` (scripts.rs) holds every
-- other file to that. Their Rust side is block.rs.

-- ---------------------------------------------------------------------------------------
-- Packets (ARCHITECTURE.md, invariant 36). The follow-ups one enqueue call makes on a
-- tracked batch queue that is not ordered (enqueue.lua mode 'ik') can be kept as one
-- packet instead of a task and a record each: BASE (text) is the call's record numbers
-- less one, its n tasks are numbered BASE+1..BASE+n as any record, and each has its entry
-- in K_IDX (so listings and done_of find them as any task).
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
-- A packet's task reads as if it had been enqueued alone. Every reader of a task or a
-- record finds a packet's, and writes nothing to do so: rec_get and rec_mget (records),
-- packet_value (an enqueue's dedup), packet_alive (locate: find, cancel, freeze),
-- ready_count, a switch's sweep (system.lua). A take hands out a packet's tasks as one
-- batch lease (packet_take), and the slot makes their metas (block.rs). Every path that
-- changes one task alone first makes it ordinary, writing what a one-by-one enqueue would
-- have: a split batch (batch_split, then packet_unpack), a cancelled or frozen waiting
-- task (packet_unpack_waiting, in its packet's place in the list). Once a task has a
-- record key, packet_value reads that record's state (a pause's note gives a waiting task
-- a key). A packet goes with its last record (rec_delete, and each sweep's look at the
-- oldest packet, for one whose ids all hold new tasks since) or with its queue
-- (drop.lua).

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

-- ---------------------------------------------------------------------------------------
-- Runs. Tasks acked as a whole batch lease (a slot's steady state) are done without a
-- write to their records. A tracked task's meta carries its record's sequence number (its
-- score in K_IDX, see records_new); the slot hands the batch's numbers back as runs
-- s1..s2 of consecutive ones, and the ack keeps each run once: the member "s1 FS s2 FS
-- expiry FS done-at FS entries" of the zset K_DONE scored by s1 (entries: the running and
-- done entries an APPEND per task would have written), and the member 'r' .. s1 .. ':' ..
-- s2 of K_ENDS scored by the expiry. A record that has not ended is done by the run that
-- holds its number (done_of). The number is the record's own: a new task under an old id
-- has a new one and is never read as done by the old task's run, and a run's sweep finds
-- its records in K_IDX by score (expire_run). An APPEND per task, with the Lua around
-- each call, was most of what tracking cost an ack; a hash from id to batch instead cost
-- as much in its inserts (a hash table of every finished task, growing).

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

-- Leases `ids` (all at their first attempt) as batch `tok` and returns them framed (FS
-- id1 FS ... FS, as the batch keeps them), unless an id holds a separator: then returns
-- false and the caller leases them per task.
local function batch_lease(tok, exp_s, ids, now, host, slot)
  -- (two plain searches: a pattern with a class tries a match at every byte, which over
  -- a batch's joined ids cost more than the rest of the lease)
  local joined = table.concat(ids)
  if string.find(joined, RS, 1, true) or string.find(joined, FS, 1, true) then return false end
  local framed = FS .. table.concat(ids, FS) .. FS
  batch_lease_framed(tok, exp_s, #ids, framed, now, host, slot)
  return framed
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

-- The packets (BASE → n, see "Packets") holding records of `ids`, before their index
-- entries go; nil when the queue has none.
local function packets_of(ids)
  if redis.call('EXISTS', K_PKTS) == 0 then return nil end
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

-- The run whose ack ended task `id` (see "Runs") as {expiry, done at, its history
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

-- ---------------------------------------------------------------------------------------
-- The blocks' interface, for the rest of the library (besides packet_record, packet_value,
-- packet_alive, packets_of and packets_forget_empty, run_begin and run_end, done_of,
-- batch_lease, batch_ack_whole, batches_split and batch_run_of, above).

-- Whether `e` is a packet's name: its entry in a ready list (standing for its waiting
-- tasks) and its waiting part's field in K_PAYLOAD; no task id is one.
local function is_packet_name(e)
  return string.sub(e, 1, #PACKET) == PACKET
end

-- Whether some batch lease is held (before building what batches_split needs).
local function batch_leases_held()
  return redis.call('EXISTS', K_BATCHES) == 1
end

-- Whether the queue holds packets now (only then can a ready entry be one).
local function queue_has_packets()
  return redis.call('EXISTS', K_PKTS) == 1
end

-- The ids ready-list entry `e` stands for: its own, or a packet's waiting ones.
local function entry_ids(e)
  if not is_packet_name(e) then return {e} end
  local v = redis.call('HGET', K_PAYLOAD, e)
  return v and waiting_ids(v) or {}
end

-- The tasks waiting in ready lists: their entries, each packet's counted as its tasks.
local function ready_count()
  local total = 0
  for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    total = total + redis.call('LLEN', ready_list(p))
  end
  return total + (tonumber(redis.call('GET', K_PKTW)) or 0)
end

-- When the longest-waiting ready task became due (ms; nil when none waits): per priority,
-- the earliest of its first 16 entries' due times (ready_dues), else their enqueue times
-- (a task's meta, a packet's store). More than the head: the front of a list may hold
-- tasks pushed back to it (a lease run out, a task given back), due more recently than
-- those behind them.
local function ready_oldest_due()
  local oldest
  local function keep(t)
    if t and (not oldest or t < oldest) then oldest = t end
  end
  local dues_kept = ready_dues.kept()
  for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
    local plain = {}
    for _, e in ipairs(redis.call('LRANGE', ready_list(p), 0, 15)) do
      if is_packet_name(e) then
        local v = redis.call('GET', packet_store_key(string.sub(e, #PACKET + 1)))
        if v then keep(tonumber((select(3, packet_parts(v))))) end
      else
        plain[#plain + 1] = e
      end
    end
    local dues = dues_kept and hmget(ready_dues.key(), plain) or {}
    local metas = metas_of(plain)
    for i = 1, #plain do
      local d = tonumber(dues[i])
      if not d and metas[i] then d = select(3, parse_meta(metas[i])) end
      keep(d)
    end
  end
  return oldest
end

-- The tasks under lease, per task or in batches.
local function leased_count()
  return redis.call('ZCARD', K_LEASED) + (tonumber(redis.call('GET', K_BATCHN)) or 0)
end

-- Splits the batch leases expired by `now` (batch_split), whole batches until about
-- `limit` tasks are out. Returns how many tasks came out.
local function batches_split_expired(now, limit)
  local n = 0
  for _, t in ipairs(redis.call('ZRANGEBYSCORE', K_BATCHES, '-inf', now, 'LIMIT', 0, limit)) do
    if n >= limit then break end
    n = n + batch_split(t)
  end
  return n
end

-- The lease of `id` when it is in a batch lease: its member as a per-task lease would
-- be ("tok:id"), its expiry and its token; `split` splits the batch first, so that the
-- member is in K_LEASED for the caller to change. nil when no batch holds it.
local function batch_lease_find(id, split)
  local tok = batch_of(id)
  if not tok then return nil end
  local exp = tonumber(redis.call('ZSCORE', K_BATCHES, tok))
  if split then batch_split(tok) end
  return tok .. ':' .. id, exp, tok
end

-- The run a K_ENDS member stands for, as s1, s2 (text); nil for a list of ended tasks.
local function run_of_end(member)
  return string.match(member, '^r(%d+):(%d+)$')
end

-- Forgets run s1..s2 (text), whose records the caller deletes (expire_run).
local function run_forget(s1, s2)
  redis.call('ZREM', K_ENDS, 'r' .. s1 .. ':' .. s2)
  -- (by member: an ACL written before ZREMRANGEBYSCORE was needed refuses it)
  bulk('ZREM', K_DONE, redis.call('ZRANGEBYSCORE', K_DONE, s1, s1))
end

-- The oldest packet goes once none of its records is left, however they went: every id
-- of it may since hold a new task (numbered anew), whose record's end never looks at the
-- packet. One look per sweep; the oldest one lives least long.
local function packets_sweep_oldest()
  if redis.call('EXISTS', K_PKTS) == 0 then return end
  local b = redis.call('ZRANGE', K_PKTS, 0, 0)[1]
  local v = b and redis.call('GET', packet_store_key(b))
  packets_forget_empty({[b] = v and select(5, packet_parts(v)) or 0})
end

-- Deletes every block of the queue (drop.lua): runs, batch leases and packets. The
-- records they stand for are the caller's.
local function blocks_drop()
  redis.call('DEL', K_DONE)
  for _, tok in ipairs(redis.call('ZRANGE', K_BATCHES, 0, -1)) do
    redis.call('DEL', batch_key(tok), batch_key(tok) .. ':p')
  end
  redis.call('DEL', K_BATCHES, K_BATCHN)
  for _, b in ipairs(redis.call('ZRANGE', K_PKTS, 0, -1)) do redis.call('DEL', packet_store_key(b)) end
  redis.call('DEL', K_PKTS, K_PKTW)
end
