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
local function chain_name(seq)
  return CHAIN_PREFIX .. seq
end

local function chain_index(chain)
  return string.sub(K_REC, 1, -3) .. 'chain:' .. chain
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
