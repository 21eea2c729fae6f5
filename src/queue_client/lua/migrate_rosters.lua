-- Layout 2 to 3, pass "rosters" (migrate.rs): the list layout 2 kept of each chain a queue
-- holds members of, a key of its own ('chain:' .. CHAIN, the ids separated by FS), moves
-- into the roster layout 3 keeps it in (chain_roster in lib/chains.lua), in its order,
-- with the later of the two expiries, and goes. Run as the body of `pass(cursor, budget)`
-- (lua/migrate.lua); returns the next cursor, or nil when done, and how many items it
-- looked at. The lists are found through the records that name a chain, by K_IDX's score
-- (the cursor is 'SCORE SKIP', as idx_page gives it): a binary of layout 2 that lists a
-- new member meanwhile gives it a record with a higher number, which the pass reaches
-- before it ends. A list none of whose members has a record left is not moved: no reader
-- shows a member without one, and the list expires by itself.
if cursor == '0' then cursor = '-inf 0' end
local a, b = string.match(cursor, '^(%S+) (%S+)$')
local ids, next_at = idx_page(a, tonumber(b), budget)
if not ids then return nil, 0 end
local read = {}
for _, id in ipairs(ids) do
  local v = rec_get(id, read)
  local g = v and chain_of(v) or ''
  local old = g ~= '' and string.sub(K_REC, 1, -3) .. 'chain:' .. g
  local list = old and redis.call('GET', old)
  if list then
    local ttl = redis.call('PTTL', old)
    local roster = chain_roster(g)
    local before = redis.call('PTTL', roster)
    local members, chains = {}, {}
    for m in string.gmatch(list, '[^\31]+') do
      members[#members + 1] = m
      chains[#chains + 1] = g
    end
    chain_index_add(members, chains, nil)
    -- (PTTL: -1 no expiry, -2 no key)
    if ttl == -1 then
      redis.call('PERSIST', roster)
    elseif before == -2 or (before >= 0 and before < ttl) then
      redis.call('PEXPIRE', roster, ttl)
    end
    redis.call('DEL', old)
  end
end
return next_at, #ids
