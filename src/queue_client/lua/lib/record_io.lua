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

-- The ack's transition for tasks leased one by one: their running entries are read and
-- removed. `attempts` is a table by position.
local function record_done_many(ids, now, attempts, host, slot, ttl_ms)
  if #ids == 0 then return end
  local keys = {}
  for k, id in ipairs(ids) do keys[k] = run_key(id) end
  records_done(ids, mget(keys), now, attempts, host, slot, ttl_ms)
  bulk('DEL', nil, keys)
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

-- Deletes the records of `ids` (their stored values in `vals`) with their index entries,
-- so the indexes never hold more than the records.
local function rec_delete(ids, vals)
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  submitters_unindex(ids, vals, '')
  local packets = packets_of(ids)
  bulk('ZREM', K_IDX, ids)
  bulk('DEL', nil, keys)
  if packets then packets_forget_empty(packets) end
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
