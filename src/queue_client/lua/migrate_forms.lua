-- Layout 1 to 2, pass "forms" (migrate.rs): the forms older releases wrote and layout 2
-- reads no more, rewritten as this release writes them, a bounded part per call. Run as
-- the body of `pass(cursor, budget)` (lua/migrate.lua); returns the next cursor, or nil
-- when done, and how many items it looked at. The cursor is a phase letter and where the
-- phase is, in this order:
--   'r SCORE SKIP': records with fewer head fields than NF (written before records named
--                   their chain) get the missing ones, empty; by K_IDX's score, SKIP
--                   members of SCORE already seen (scores need not be unique);
--   'm CURSOR':     the `meta` hash (K_META, releases before metas moved into the payload
--                   value): each entry goes into its task's value (task_value) and out of
--                   K_META, which goes when it holds only its pin ('');
--   'p CURSOR':     a tracked task's meta without its chain field (written before metas
--                   kept it) gets the one its record names: '' none, 's' its own id, 'c'
--                   and the chain otherwise (what layout 1's readers read from the
--                   record); the "chains" pass then writes layout 2's chain fields.
-- Each rewrite is what a reader of the old form read, so slots of the previous release
-- running meanwhile see the same task before and after.
local phase, a, b = string.match(cursor, '^(%a) ?(%S*) ?(%S*)$')
if cursor == '0' then phase, a, b = 'r', '-inf', '0' end
if phase == 'r' then
  local ids, next_at = idx_page(a, tonumber(b), budget)
  if not ids then return 'm 0', 0 end
  local keys = {}
  for i, id in ipairs(ids) do keys[i] = rec_key(id) end
  local vals = mget(keys)
  for i, v in ipairs(vals) do
    -- (a packet's task has no string of its own: its packet's is of layout 2)
    if v and not string.match(v, G_PAT) then
      local f, hist = rec_parse(v)
      redis.call('SET', keys[i], rec_pack(f, hist), 'KEEPTTL')
    end
  end
  return 'r ' .. next_at, #vals
end
if phase == 'm' then
  local scan = redis.call('HSCAN', K_META, a, 'COUNT', budget)
  local pairs_ = scan[2]
  local n = 0
  for i = 1, #pairs_, 2 do
    local id, m = pairs_[i], pairs_[i + 1]
    if id ~= '' then
      local v = redis.call('HGET', K_PAYLOAD, id)
      if v then redis.call('HSET', K_PAYLOAD, id, task_value(m, v)) end
      redis.call('HDEL', K_META, id)
      n = n + 1
    end
  end
  if scan[1] ~= '0' then return 'm ' .. scan[1], n end
  if redis.call('HLEN', K_META) > 1 then return 'm 0', n end
  redis.call('DEL', K_META)
  return 'p 0', n
end
if redis.call('EXISTS', K_IDX) == 0 then return nil, 0 end
local scan = redis.call('HSCAN', K_PAYLOAD, a, 'COUNT', budget)
local pairs_ = scan[2]
for i = 1, #pairs_, 2 do
  local id, v = pairs_[i], pairs_[i + 1]
  -- (the pin and a packet's waiting part, `#pBASE`, are no task's value)
  local task = id ~= '' and not is_packet_name(id)
  local head, field = meta_chain_field(value_meta(v))
  local rec = task and head and not field and redis.call('GET', rec_key(id))
  if rec then
    local g = chain_of(rec)
    local mark = (g == '' and '') or (g == id and 's') or ('c' .. g)
    redis.call('HSET', K_PAYLOAD, id, task_value(head .. ':' .. mark, string.sub(v, #head + 2)))
  end
end
if scan[1] ~= '0' then return 'p ' .. scan[1], #pairs_ / 2 end
return nil, #pairs_ / 2
