-- Chains. A chain's id is minted from its global task's queue and record number,
-- '~c' .. QUEUE .. '.' .. SEQ: unique in the namespace while the queue lives (its counter
-- never goes back; a queue dropped and made again starts over, and readers tell an older
-- chain's leftovers by their records' time: `crate::chain`), the same on one server and
-- on a cluster, and a form no client id may take (`crate::queue_client::check_id`). The
-- same task run again under its id has a new number, so a new chain. Follow-up ids derive
-- from it (`crate::chain::derived_id`), and each queue lists the members it holds of each
-- chain, written in the step that enqueues them: a reader asks every queue
-- (chain_members.lua) and the global task's queue's K_IDX (by the number in the chain's
-- id), and nothing is claimed or renamed.
-- The lists of 128 chains of consecutive numbers share one string, a roster
-- (chain_roster): entries "CHAIN FS ID RS", in the order they were added. A key per chain
-- was a new key with its own expiry per follow-up, and cost Redis as much as the rest of
-- the follow-up's enqueue (BENCHMARKS.md, "Seventh look"); an enqueue's follow-ups,
-- children of one batch, mostly fall in one or two rosters, each one APPEND. A roster
-- lives twice its queue's history_ttl after its last entry was added, so it outlives the
-- records of its members.

local function chain_name(seq)
  return CHAIN_PREFIX .. seq
end

-- The key of the roster that lists this queue's members of `chain`: for a chain of the
-- form chain_name makes, ~cQUEUE.SEQ, the roster of that queue's chains SEQ / 128
-- (rounded down), named '~c' .. QUEUE .. '.' .. floor(SEQ / 128) (a name, not a chain:
-- it holds many); for a chain of another form (layout 1's, which gaffer migrate listed
-- under their old names, never starting '~c') a roster of its own, named as the chain.
local function chain_roster(chain)
  local origin, seq = string.match(chain, '^(~c.*%.)(%d+)$')
  local name = chain
  if origin then name = origin .. string.format('%d', math.floor(tonumber(seq) / 128)) end
  return string.sub(K_REC, 1, -3) .. 'chains:' .. name
end

-- Lists each of `ids` in the list of its chain (chains[i], '' none): one APPEND per
-- roster, which then lives 2 × ttl_ms from now (kept as it was without a ttl). (A member
-- listed twice, which only a migration run again can do, is read once.)
local function chain_index_add(ids, chains, ttl_ms)
  local keep = ttl_ms and ttl_ms > 0 and 2 * ttl_ms
  local order, entries = {}, {}
  for i, id in ipairs(ids) do
    local g = chains[i]
    if g and g ~= '' then
      local key = chain_roster(g)
      local e = entries[key]
      if not e then
        e = {}
        entries[key] = e
        order[#order + 1] = key
      end
      e[#e + 1] = g .. FS .. id .. RS
    end
  end
  for _, key in ipairs(order) do
    redis.call('APPEND', key, table.concat(entries[key]))
    if keep then redis.call('PEXPIRE', key, keep) end
  end
end
