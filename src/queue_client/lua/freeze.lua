-- ARGV: the head (FreezeHead in args.rs, read by name as A.id, …): id, action ('freeze' |
-- 'thaw'), note, ordered ('1': the queue runs its tasks in creation order, so a thawed
-- task goes back in its place among the first 100 waiting, behind those created before
-- it; one not yet due and created before the first one waiting holds the queue as a
-- retried head does, unless another head does already). Freeze holds a waiting task
-- (ready or delayed) out of reach of takers until it is thawed; thaw puts it back where
-- its due time says (ready, or delayed while not due). Returns where the task is
-- afterwards: 'frozen', 'ready' or 'delayed' (idempotent: a frozen task frozen again, a
-- waiting one thawed), or, when the action does not apply, its state as it is ('leased',
-- 'dead'); nil when unknown.
local now = now_ms()
local A = head(ARGV, FREEZE_HEAD)
local id, action, note = A.id, A.action, A.note
-- A.owner, '' any: see find.lua
if not rec_owned_by(id, A.owner or '') then return nil end
-- (a packet's waiting task is made an ordinary one before it is frozen)
local state, score, m = locate(id, now, false, action == 'freeze')
if not state then return nil end
if action == 'freeze' then
  if state == 'ready' then
    ready_remove(parse_meta(m), id)
    redis.call('ZADD', K_FROZEN, now, id)
  elseif state == 'delayed' or state == 'due' then
    redis.call('ZREM', K_DELAYED, id)
    redis.call('ZADD', K_FROZEN, score, id)
    -- (a retried head of an ordered queue held its takes, which sleep on its due time)
    if A.ordered == '1' and redis.call('EXISTS', K_READY) == 1 then wake(1) end
  elseif state == 'frozen' then
    return 'frozen'
  else
    return state
  end
  record(id, 'frozen', now, nil, '', '', note)
  return 'frozen'
end
if state ~= 'frozen' then
  if state == 'due' then return 'ready' end
  return state
end
redis.call('ZREM', K_FROZEN, id)
-- When a task was created: its enqueue time, then its record's number (0 without one).
local function created(meta)
  local enq, seq = string.match(meta, '^-?%d+:%d+[^:]*:(%d+)%.?(%d*)')
  return tonumber(enq) or 0, tonumber(seq) or 0
end
-- How many of the first tasks waiting at `pri` (at most 100 looked at) were created
-- before the task of meta `mine`; nil when all of those were (it goes at the back).
local LOOK = 100
local function older_ahead(mine, pri)
  local ahead = redis.call('LRANGE', ready_list(pri), 0, LOOK - 1)
  local metas = metas_of(ahead)
  local a, s = created(mine)
  for i = 1, #ahead do
    local theirs = metas[i]
    if theirs then
      local b, t = created(theirs)
      if a < b or (a == b and s < t) then return i - 1 end
    end
  end
  return #ahead == 0 and 0 or nil
end
local pri = parse_meta(m)
local older = A.ordered == '1' and older_ahead(m, pri)
local where = 'ready'
if score > now then
  redis.call('ZADD', K_DELAYED, score, id)
  if older == 0 and not redis.call('HGET', K_CONF, 'head') then
    redis.call('HSET', K_CONF, 'head', id)
  end
  where = 'delayed'
elseif older then
  -- Back in its place among the first tasks waiting: behind those created before it.
  local prefix = older > 0 and redis.call('LPOP', ready_list(pri), older) or {}
  push_ready(pri, {id}, true, now)
  push_ready(pri, prefix, true)
  wake(1)
else
  push_ready(pri, {id}, false, now)
  wake(1)
end
record(id, 'waiting', now, nil, '', '', note)
return where
