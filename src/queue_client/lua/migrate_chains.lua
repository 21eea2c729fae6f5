-- Layout 1 to 2, pass "chains" (migrate.rs): chains as layout 1 kept them (named by their
-- global task's id, or QUEUE:ID on one server; found through member lists under tags of
-- their own, or from their records) become chains layout 2 reads, under the same names.
-- Run as the body of `pass(cursor, budget)` (lua/migrate.lua); returns the next cursor,
-- or nil when done, and how many items it looked at. The cursor is a phase letter and
-- where the phase is, in this order:
--   'g CURSOR':     a task's meta that says it is the global task of its own chain ('s',
--                   named by its id, or 'u', named QUEUE:ID) names the chain ('g' and the
--                   name), as layout 2's metas do;
--   'i SCORE SKIP': every record in a chain is listed in its queue's list of that chain
--                   (chain_index_add: in the current layout's form, which the next
--                   step's pass then finds done), a follow-up (its record's submitter
--                   is `chain:G`) by its id, a global task marked '^', as no number
--                   finds it; by K_IDX's score, SKIP members of SCORE already seen.
-- A list lives LEGACY_SET_MS: lists of chains started after the upgrade live twice
-- their queue's history_ttl from their last member, which the pass does not know.
local LEGACY_SET_MS = 60 * 24 * 3600 * 1000
local phase, a, b = string.match(cursor, '^(%a) ?(%S*) ?(%S*)$')
if cursor == '0' then phase, a, b = 'g', '0', '' end
if phase == 'g' then
  local scan = redis.call('HSCAN', K_PAYLOAD, a, 'COUNT', budget)
  local pairs_ = scan[2]
  for i = 1, #pairs_, 2 do
    local id, v = pairs_[i], pairs_[i + 1]
    local head, field = meta_chain_field(value_meta(v))
    local name = (field == 's' and id)
      or (field == 'u' and string.match(K_REC, '{(.-)}') .. ':' .. id)
    if id ~= '' and name then
      redis.call('HSET', K_PAYLOAD, id, task_value(head .. ':g' .. name, string.sub(v, #head + #field + 3)))
    end
  end
  if scan[1] ~= '0' then return 'g ' .. scan[1], #pairs_ / 2 end
  return 'i -inf 0', #pairs_ / 2
end
local ids, next_at = idx_page(a, tonumber(b), budget)
if not ids then return nil, 0 end
local members, chains = {}, {}
for _, id in ipairs(ids) do
  local v = rec_get(id, {})
  local g = v and chain_of(v) or ''
  if g ~= '' then
    members[#members + 1] = (rec_submitter(v) == 'chain:' .. g) and id or ('^' .. id)
    chains[#chains + 1] = g
  end
end
chain_index_add(members, chains, LEGACY_SET_MS / 2)
return 'i ' .. next_at, #ids
