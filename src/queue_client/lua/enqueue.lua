-- ARGV: the head (EnqueueHead in args.rs, read by name as A.n, A.priority, …): n,
--   priority, delay_ms, at_ms (0: none), max_attempts, mode, track ('1': keep a
--   record), submitted_by, dedup ('a' active | 'r' record; then 'o' when the ids are the
--   submitter's own, see own_ids_taken), intake (the config's value,
--   used while no run-time switch is set), history_ttl_ms, root ('1': each task is the
--   global task of a chain of its own, named from its record number, see chain_name:
--   submitted with `chain`, or a task of a queue whose `next` routes make follow-ups of
--   every done task), the config's system state
--   ('paused:NAME' for a system the config starts paused, else ''; a run-time switch
--   wins), then
--   mode 'p':  n payloads (ids generated), or
--   mode 'ip': n × (id, payload) (ids given: dedup applies), or
--   mode 'ig': n × (id, payload, chain): follow-ups of chain G (ids derived from their
--              parent's; dedup against records too, so a parent run again after its slot
--              died finds the children it made, even those that already finished), or
--   mode 'ik': the follow-ups of 'ig' as n ids, then their chains separated by FS, then
--              their payloads each framed "LEN:bytes" (two arguments the slot makes): kept
--              as one packet (see lib/blocks.lua) when the queue tracks, none of the ids has
--              a task or a record, and nothing holds or delays them; else as in 'ig'.
-- Options are shared by the call (the client splits calls where they differ), which keeps
-- per-task arguments, the main cost of a bulk enqueue, to one or two.
-- Returns a reply tagged by its kind (`EnqueueReply` in enqueue.rs): {'ok', base, flags}:
-- generated ids are '~g' .. (base + i) for the i-th task (1-based;
-- URL-unreserved characters only, a form no client id may take: see GENERATED_ID_PREFIX
-- in enqueue.rs; builds before generated '#' .. (base + i), which a URL cannot hold),
-- and flags holds one character per task: '1' created, '0' an existing task with that id
-- was kept, 'x' recorded as cancelled at once (the intake is 'cancel'). Returns {'closed'}
-- and changes nothing when the intake is closed; {'taken', flags} and changes nothing when
-- ids are the submitter's own (A.dedup ends in 'o') and another submitter's task holds
-- some ('t' for those, '-' the rest). In mode 'ig', an id held by a task (or a
-- live record) of another chain, or of none, is not a child an earlier run of the parent
-- made: the call then creates nothing, and flags those 'c' (another chain's) or 'n' (no
-- chain's) and the rest '-'. Replies stay small, which matters as much as the work.
local H = #ENQUEUE_HEAD
local A = head(ARGV, ENQUEUE_HEAD)
local now = now_ms()
local n = tonumber(A.n)
local pri, delay, at = tonumber(A.priority), tonumber(A.delay_ms), tonumber(A.at_ms)
local ma = A.max_attempts
local mode = A.mode
local follow = mode == 'ig' or mode == 'ik'
local track, by = A.track == '1', A.submitted_by
local dedup_record = string.sub(A.dedup, 1, 1) == 'r' or follow
-- 'o' after the dedup letter: ids are the submitter's own (see own_ids_taken)
local own_ids = string.sub(A.dedup, 2, 2) == 'o'
local root = A.root == '1'
local per = (mode == 'ig') and 3 or 2
-- Each task's id, payload and chain (a follow-up's) as sent.
local arg_id = function(i) return ARGV[H + per * (i - 1) + 1] end
local arg_payload = function(i) return ARGV[H + per * (i - 1) + 2] end
local arg_chain = function(i) return ARGV[H + per * (i - 1) + 3] end
if mode == 'ik' then
  arg_id = function(i) return ARGV[H + i] end
end
local intake = redis.call('HGET', K_CONF, 'intake') or A.intake
local ttl = tonumber(A.history_ttl_ms)
if intake == 'closed' then return {'closed'} end
local cancel = intake == 'cancel'
local cancel_note = 'cancelled on arrival: the intake of the queue is cancel'
-- A disabled system cancels its queues' new tasks; a paused one holds them, saying why.
local waiting_note = ''
local sys_state, sys_name = system_switch()
if not sys_state and A.system ~= '' then
  sys_state, sys_name = string.match(A.system, '^(%a+):(.*)$')
end
if sys_state == 'disabled' then
  cancel, cancel_note = true, 'system ' .. sys_name .. ' is disabled'
elseif sys_state == 'paused' then
  waiting_note = 'held: system ' .. sys_name .. ' is paused'
end
-- A limited api key's submit of given ids ('o'): an id whose task or kept record names
-- another submitter is refused, the whole call, before anything is written. Decided here,
-- in the enqueue's own step, so no submit can slip between a check and the write: a key
-- can neither join another key's task (a dedup hit on its payload), nor replace its ended
-- one under `dedup = "active"`, nor learn its state. A record whose time is up counts for
-- nothing (rec_visible_value, as readers see it); a task without a record (an untracked
-- queue's) names no submitter, and is not refused.
local function own_ids_taken()
  local given, keys = {}, {}
  for i = 1, n do
    given[i] = arg_id(i)
    keys[i] = rec_key(given[i])
  end
  local cache, taken, any = {}, {}, false
  local vals = rec_mget(given, keys, cache)
  for i = 1, n do
    local v = vals[i] and rec_visible_value(given[i], vals[i], now, cache)
    local t = v and rec_submitter(v) ~= by
    taken[i] = t and 't' or '-'
    any = any or t
  end
  return any and table.concat(taken)
end
if own_ids and mode == 'ip' and track then
  local taken = own_ids_taken()
  if taken then return {'taken', taken} end
end
-- (a time limit of the tasks' own rides on their max_attempts: see parse_meta)
local meta = pack_meta(A.priority, A.timeout_ms == '0' and ma or (ma .. 't' .. A.timeout_ms), now)
-- A tracked task's meta also carries its record's sequence number after its enqueue time
-- (".seq", see "Runs" in lib/blocks.lua) and its chain field (see parse_meta): 'g' and the
-- chain a global task starts, '' one in no chain, or 'c' and a follow-up's chain. An untracked task has no record to
-- number or to name a chain in. Each task's value (see task_value) is made in one
-- concatenation: every part made apart is a string Lua makes, hashes and collects.
local due = now + delay
-- (a moment already past is now, as for a task without one)
if at > 0 then due = math.max(at, now) end
local is_delayed = due > now
local base = redis.call('INCRBY', K_SEQ, n) - n

-- Follow-ups as one packet: each gets its listing entry; the rest is written per call.
local function as_packet()
  if not (track and not cancel and waiting_note == '' and not is_delayed) then return false end
  local ids = {}
  for i = 1, n do ids[i] = ARGV[H + i] end
  if string.find(table.concat(ids), '[\30\31]') then return false end
  for _, v in ipairs(redis.call('ZMSCORE', K_IDX, unpack(ids))) do
    if v then return false end
  end
  for _, v in ipairs(redis.call('HMGET', K_PAYLOAD, unpack(ids))) do
    if v then return false end
  end
  local scored = {}
  for i = 1, n do
    scored[2 * i - 1] = string.format('%d', base + i)
    scored[2 * i] = ids[i]
  end
  redis.call('ZADD', K_IDX, unpack(scored))
  packet_write(base, ids, A.priority, ma, now, due, ARGV[H + n + 1], ARGV[H + n + 2])
  local chains, i = {}, 0
  for g in string.gmatch(ARGV[H + n + 1] .. FS, '([^\31]*)\31') do
    i = i + 1
    chains[i] = g
  end
  chain_index_add(ids, chains, ttl)
  redis.call('HINCRBY', K_STATS, 'enqueued', n)
  -- One taker takes a packet (a take that leaves more of it wakes a peer): a wake-up per
  -- task would send the rest on empty takes.
  wake(1)
  return true
end
if mode == 'ik' then
  if as_packet() then return {'ok', base, string.rep('1', n)} end
  -- One by one, as 'ig': the chains and payloads taken apart.
  local chains, payloads = {}, {}
  local block = ARGV[H + n + 1]
  local from = 1
  for i = 1, n do
    local cut = string.find(block, FS, from, true) or (#block + 1)
    chains[i] = string.sub(block, from, cut - 1)
    from = cut + 1
  end
  payloads = framed_payloads(ARGV[H + n + 2], 1, n)
  arg_chain = function(i) return chains[i] end
  arg_payload = function(i) return payloads[i] end
end
local payloads, ids, seqs, flags = {}, {}, {}, nil
-- per created task: its chain's global task ('' none), when any task has one
local chains = nil
-- the created tasks' record keys, and the records their ids had (false: none), when the
-- lookup made them
local created_keys, olds = nil, nil
-- dead letters a new task under their id replaced
local superseded = {}
-- whether any created task's id had a record (else `olds` is not handed on)
local any_old = false
local created = 0

-- The chain ('' none) of the task (its value) or else the record holding a follow-up's
-- id: the follow-up's own chain when an earlier run of the same parent made it.
local function chain_held(id, value, rec)
  if value then
    local _, field = meta_chain_field(value_meta(value))
    if field then return string.match(field, '^[gc](.*)$') or '' end
  end
  return rec and chain_of(rec) or ''
end

if mode == 'p' then
  -- Generated ids cannot clash: no lookups, indices instead of the # operator. The
  -- sequence number is made text once, as an integer: Lua's own number-to-text (for
  -- `..`, and for a number handed to redis.call) is a floating-point printf, which was a
  -- tenth of an enqueue's work.
  if track then
    -- (the meta's parts around the number made once: see task_value)
    local pre, post = meta .. '.', ':\n'
    if root then chains = {} end
    for i = 1, n do
      local s = string.format('%d', base + i)
      local id = '~g' .. s
      payloads[2 * i - 1] = id
      if root then
        chains[i] = chain_name(s)
        post = ':g' .. chains[i] .. '\n'
      end
      payloads[2 * i] = pre .. s .. post .. ARGV[H + i]
      ids[i] = id
      -- (the records' index order)
      seqs[i] = s
    end
  else
    local head = meta .. '\n'
    for i = 1, n do
      local id = string.format('~g%d', base + i)
      payloads[2 * i - 1] = id
      payloads[2 * i] = head .. ARGV[H + i]
      ids[i] = id
    end
  end
  created = n
  flags = string.rep(cancel and 'x' or '1', n)
else
  -- Dedup against records: one whose time is up must not count (see record_get.lua).
  if dedup_record then expire_records(now, 100) end
  -- A tracked queue reads the records the ids have: to dedup against them, and so that a
  -- new task under an ended one's id leaves that task's submitter's index (see
  -- records_new).
  if track then created_keys, olds = {}, {} end
  -- What exists already, looked up in one command each for the whole call: a command
  -- from Lua per task cost more than the lookups themselves.
  local given = {}
  for i = 1, n do given[i] = arg_id(i) end
  -- (every task has its field in K_PAYLOAD: see task_value)
  local values_now = hmget(K_PAYLOAD, given)
  -- (whether the queue has packets, read once: see rec_get)
  local packets = {}
  -- a packet's task that has not ended exists as much as a task with a field
  for i = 1, n do
    if not values_now[i] then values_now[i] = packet_value(given[i], packets) or false end
  end
  local recs_now, rec_keys = {}, {}
  if dedup_record then
    for i = 1, n do rec_keys[i] = rec_key(given[i]) end
    recs_now = rec_mget(given, rec_keys, packets)
  elseif track then
    -- Only the records of ids no task holds: the others are dedup hits, whose records
    -- (histories, results) need not be copied in (a superseded dead letter's is read below).
    local want, at, at_ids = {}, {}, {}
    for i = 1, n do
      rec_keys[i] = rec_key(given[i])
      if not values_now[i] then
        want[#want + 1] = rec_keys[i]
        at[#at + 1] = i
        at_ids[#at_ids + 1] = given[i]
      end
    end
    local got = rec_mget(at_ids, want, packets)
    for j, i in ipairs(at) do recs_now[i] = got[j] end
  end
  -- what the records' visibility reads once for the whole call (see rec_visible)
  local due = {}
  local seen, fl, foreign = {}, {}, false
  for i = 1, n do
    local id = given[i]
    local fresh = true
    if seen[id] then
      fresh = false
    elseif values_now[i] then
      if redis.call('ZSCORE', K_DEAD, id) and not dedup_record then
        -- a dead letter with this id is superseded by the new task
        redis.call('ZREM', K_DEAD, id)
        redis.call('HDEL', K_ERR, id)
        redis.call('HDEL', K_ATT, id)
        superseded[#superseded + 1] = id
        if track and not dedup_record then recs_now[i] = rec_get(id, packets) end
      else
        fresh = false
      end
    elseif dedup_record and recs_now[i] and rec_live(id, recs_now[i], now, due) then
      -- the finished task's record still lives, and the queue dedups against it
      fresh = false
    end
    fl[i] = fresh and (cancel and 'x' or '1') or '0'
    if follow and not fresh and not seen[id] then
      local holder = chain_held(id, values_now[i], recs_now[i])
      if holder ~= arg_chain(i) then
        fl[i] = holder == '' and 'n' or 'c'
        foreign = true
      end
    end
    if fresh then
      seen[id] = true
      created = created + 1
      if created_keys then
        created_keys[created] = rec_keys[i]
        olds[created] = recs_now[i]
        any_old = any_old or recs_now[i]
      end
      payloads[2 * created - 1] = id
      ids[created] = id
      local s = string.format('%d', base + i)
      seqs[created] = s
      local field = ''
      if follow then
        chains = chains or {}
        chains[created] = arg_chain(i)
      elseif root then
        chains = chains or {}
        chains[created] = chain_name(s)
        field = 'g' .. chains[created]
      end
      if not track then
        payloads[2 * created] = task_value(meta, arg_payload(i))
      elseif follow then
        payloads[2 * created] = meta .. '.' .. s .. ':c' .. arg_chain(i) .. '\n' .. arg_payload(i)
      else
        payloads[2 * created] = meta .. '.' .. s .. ':' .. field .. '\n' .. arg_payload(i)
      end
    end
  end
  flags = table.concat(fl)
  if foreign then return {'ok', base, (string.gsub(flags, '[^cn]', '-'))} end
end

-- (a follow-up's chain lists it in this queue, cancelled on arrival or not: see
-- chain_index_add)
if follow and created > 0 and track then chain_index_add(ids, chains, ttl) end
if not any_old then olds = nil end
-- A superseded dead letter leaves its value under cancel (no new value replaces it).
if #superseded > 0 and cancel then bulk('HDEL', K_PAYLOAD, superseded) end
if created > 0 and cancel then
  -- Recorded and ended at once: nothing enqueued, nothing to run.
  if track then
    records_new(ids, seqs, 'cancelled', now, pri, ma, due, by,
      cancel_note, ttl, mode ~= 'p', chains, root, created_keys, olds)
  end
  redis.call('HINCRBY', K_STATS, 'cancelled', created)
elseif created > 0 then
  bulk('HSET', K_PAYLOAD, pinned(payloads))
  if is_delayed then
    local delayed = {}
    for i, id in ipairs(ids) do
      delayed[2 * i - 1] = due
      delayed[2 * i] = id
    end
    bulk('ZADD', K_DELAYED, delayed)
  else
    push_ready(pri, ids, false)
  end
  if track then
    records_new(ids, seqs, 'waiting', now, pri, ma, due, by, waiting_note, 0, mode ~= 'p', chains,
      root, created_keys, olds)
  end
  redis.call('HINCRBY', K_STATS, 'enqueued', created)
  wake(created)
end
return {'ok', base, flags}
