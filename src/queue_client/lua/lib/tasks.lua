-- A queue's tasks as the library keeps them: ready lists, stored values and metas,
-- leases, attempts and wake-up tokens. The keys are docs/STORAGE.md's.
--
-- One entry per ready task (ARCHITECTURE.md, invariant 5): a ready task is in exactly one
-- priority list, once. An entry left behind could hand the task out twice (once its id is
-- enqueued again, say), so whatever takes a ready task out of turn removes its entry: a
-- cancel or a freeze pays an LREM, O(the list), rather than leave a stale one.

-- Wake-up tokens kept at most: enough to wake that many idle takers at once.
local WAKE_CAP = 256

-- Ready tasks wait in one list per priority (FIFO, O(1) push and pop); K_READY is the
-- sorted set of priorities that have a list, score -priority, so the highest comes first.
-- The lists' names extend K_READY and so share its hash tag and cluster slot.
local function ready_list(pri)
  return K_READY .. ':' .. pri
end

-- When a ready task became due, for those that did not become ready at their enqueue (a
-- delayed task come due, a retry without delay, a lease that ran out, a task given back,
-- thawed or requeued): K_READY .. ':due', a hash id → ms. A task's lateness (stats.lua)
-- counts from it, else from the enqueue time in its meta. Its entry goes when the task
-- leaves its list (a take, ready_remove); a queue whose ready tasks all came from
-- enqueues has no such key, and a take then pays one EXISTS for it. One table, not four
-- locals: a library's main chunk may hold at most 200 (its functions name the key
-- themselves, as the table is not in scope inside its own constructor).
local ready_dues = {
  key = function()
    return K_READY .. ':due'
  end,
  -- Whether any ready task has a due time kept (a take asks once).
  kept = function()
    return redis.call('EXISTS', K_READY .. ':due') == 1
  end,
  -- Forgets the due times of ids that left the ready lists.
  drop = function(ids)
    if #ids > 0 then bulk('HDEL', K_READY .. ':due', ids) end
  end,
  -- Keeps the due time of ids: `due` a number for all, or a table parallel to ids.
  set = function(ids, due)
    local items = {}
    for i, id in ipairs(ids) do
      items[#items + 1] = id
      items[#items + 1] = type(due) == 'table' and due[i] or due
    end
    if #items > 0 then bulk('HSET', K_READY .. ':due', items) end
  end,
}

-- Appends ids (all of one priority) to the back of their list, or puts them at the front
-- when `front` (reclaimed or given back tasks were taken before everything behind them),
-- in their order either way: LPUSH puts each id before the ones pushed earlier, so the
-- front's are pushed last to first. `due`: nil for tasks ready at their enqueue (or back
-- in the list they just left, due times kept), else when they became due (a number for
-- all, or a table parallel to ids), kept for their lateness (ready_dues).
local function push_ready(pri, ids, front, due)
  if #ids == 0 then return end
  if due then ready_dues.set(ids, due) end
  if front and #ids > 1 then
    local rev = {}
    for i = #ids, 1, -1 do rev[#rev + 1] = ids[i] end
    ids = rev
  end
  bulk(front and 'LPUSH' or 'RPUSH', ready_list(pri), ids)
  redis.call('ZADD', K_READY, -pri, pri)
end

-- Takes one ready task of priority `pri` out of its list, out of turn (a cancel, a
-- freeze): O(the list), which such rare calls pay rather than leave an entry behind.
local function ready_remove(pri, id)
  local list = ready_list(pri)
  redis.call('LREM', list, 1, id)
  if redis.call('LLEN', list) == 0 then redis.call('ZREM', K_READY, pri) end
  ready_dues.drop({id})
end

-- Groups ids by priority and pushes each group: for moves of many tasks at once. `due`
-- as push_ready's (a table stays parallel to ids).
local function push_ready_grouped(pris, ids, front, due)
  local groups, dues, order = {}, {}, {}
  for i, id in ipairs(ids) do
    local p = pris[i]
    if not groups[p] then
      groups[p], dues[p] = {}, {}
      order[#order + 1] = p
    end
    local g = groups[p]
    g[#g + 1] = id
    if type(due) == 'table' then dues[p][#g] = due[i] end
  end
  for _, p in ipairs(order) do
    push_ready(p, groups[p], front, type(due) == 'table' and dues[p] or due)
  end
end

-- meta = "priority:max_attempts:enqueued_ms" for an untracked task (max_attempts
-- followed by 't' and the task's own time limit in ms when its submit gave one, which only
-- the slot reads); a tracked one's goes
-- on ".SEQ:CHAIN": SEQ its record's sequence number (its score in K_IDX, which the slot
-- hands back with its acks, see "Runs" in lib/blocks.lua), CHAIN what chains need to know of it without
-- reading its record: '' (in no chain), 'g' and the chain's id (the global task of that
-- chain, see chain_name) or 'c' and the chain's id (a follow-up).
local function parse_meta(m)
  local pri, ma, enq = string.match(m, '^(-?%d+):(%d+)[^:]*:(%d+)')
  return tonumber(pri), tonumber(ma), tonumber(enq)
end

-- A meta's head (priority:max_attempts:enqueued_ms[.SEQ]) and its CHAIN field ('', or
-- 'g' or 'c' and the chain; nil in an untracked task's meta).
local function meta_chain_field(m)
  local head, rest = string.match(m, '^(%-?%d+:%d+[^:]*:[%d%.]+)(.*)$')
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
local PIN = ('-'):rep(80)
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
    -- (an LTRIM only when this push took the list over its cap)
    if redis.call('RPUSH', K_WAKE, unpack(toks)) > WAKE_CAP then
      redis.call('LTRIM', K_WAKE, -WAKE_CAP, -1)
    end
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
