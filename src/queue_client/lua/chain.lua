-- What chains need of a queue's tasks, read (or set) in one call for a batch's parents.
-- ARGV: op, then
--   op 'get': starting, then ids → per id {g, m}: its chain ('' none; false: no record;
--             1: the task's own id, the common case, sent as a number rather than again)
--             and its max_attempts as enqueued ('' when the task is gone, or starting:
--             a done task's attempts no longer matter).
--             `starting` has one character per id: '1' for a task about to start a chain
--             of its own (it has follow-ups and may be in none).
--             The chain comes from the task's meta, where its enqueue put it (see
--             parse_meta): no record is read. Only a task whose meta does not say (enqueued
--             before metas kept it, or untracked), and one about to start a chain whose
--             record names none (its queue had no `next` route when it was enqueued: a
--             handler's own follow-ups), is looked up in its record; the latter is named
--             the chain of its own id there and then, so the record is read and written
--             once (the slot's claim of that id follows; should another task hold it,
--             'set' renames it);
--   op 'set': pairs (id, chain) → sets the record's chain where it has none yet or has
--             its own id (a task that became the global task of a chain by adding
--             follow-ups). Returns how many it set. A chain other than the task's own id
--             (renamed: another task's or run's chain had it) goes in the task's meta too,
--             so that its next attempt starts from that name, not from its id, whose
--             chain may meanwhile have expired: its children keep their ids.
local op = ARGV[1]
-- The record with its (empty) chain field set to `g`.
local function with_chain(v, g)
  local cut = string.find(v, RS, 1, true)
  return string.sub(v, 1, cut - 1) .. g .. string.sub(v, cut)
end
-- A task's chain from its record (false: no record), named its own id when `starting`
-- and the record names none.
local function chain_in_record(id, starting)
  local key = rec_key(id)
  local v = rec_get(id, {})
  if not v then return false end
  local g = string.match(v, G_PAT)
  if g == '' and starting then
    redis.call('SET', key, with_chain(v, id))
    return id
  end
  return g or chain_of(v)
end
if op == 'get' then
  local out = {}
  local starting = ARGV[2]
  local ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
  local metas = metas_of(ids)
  -- (a packet's task the slot holds has no field of its own: its packet says, see
  -- prelude.lua)
  if redis.call('EXISTS', K_PKTS) == 1 then
    for i, id in ipairs(ids) do
      local seq = not metas[i] and tonumber(redis.call('ZSCORE', K_IDX, id))
      local pri, ma, created, _, g
      if seq then pri, ma, created, _, g = packet_fields_at(id, seq) end
      if pri then metas[i] = packet_meta_of(seq, pri, ma, created, g) end
    end
  end
  for i, id in ipairs(ids) do
    local starts = string.byte(starting, i) == 49
    local g, ma = nil, ''
    local m = metas[i]
    if m then
      local tail
      ma, tail = string.match(m, '^-?%d+:(%d+):%d+%.?%d*(.*)$')
      if tail == ':s' then
        g = id
      elseif tail == ':u' then
        g = string.match(K_REC, '{(.-)}') .. ':' .. id
      elseif tail == ':' then
        if not starts then g = '' end
      elseif string.sub(tail, 1, 2) == ':c' then
        g = string.sub(tail, 3)
      end
    end
    if g == nil then g = chain_in_record(id, starts) end
    if g == id then g = 1 end
    out[#out + 1] = g
    out[#out + 1] = (not starts and ma) or ''
  end
  return out
end
-- The meta of a live task with its chain field `c` .. g.
local function meta_names(id, g)
  local m = meta_of(id)
  local head = m and meta_chain_field(m)
  if head and m ~= head .. ':c' .. g then set_meta(id, head .. ':c' .. g) end
end
local n = 0
for i = 2, #ARGV, 2 do
  local id, g = ARGV[i], ARGV[i + 1]
  if g ~= id then meta_names(id, g) end
  local key = rec_key(id)
  local v = rec_get(id, {})
  local now_g = v and string.match(v, G_PAT)
  if now_g == '' then
    -- the empty chain field ends the head: the chain goes just before the history
    redis.call('SET', key, with_chain(v, g))
    n = n + 1
  elseif (now_g == id and g ~= id) or (v and not now_g and chain_of(v) == '') then
    -- named its own id by 'get', which another task's chain turned out to have; or a
    -- record of an older layout without a chain
    local f, hist = rec_parse(v)
    f[F.g] = g
    redis.call('SET', key, rec_pack(f, hist))
    n = n + 1
  end
end
return n
