-- Run-time controls of a queue: what holds its takes, and the cancels asked of its long
-- tasks.
--
-- What holds a take (ARCHITECTURE.md, invariant 31; the take's side is in lease.rs, the
-- switch's in system.rs): the queue's copy of its system's switch, else the config's
-- `paused`, and on an ordered queue its order. An ordered queue runs one task at a time,
-- in creation order: a take hands out nothing while a task is leased, while its retried
-- head (K_CONF 'head', which keeps its place) is not yet due, or while a requeue of dead
-- letters to its front has chunks to come (K_CONF 'requeuing', at most 10 s: see
-- dead_move.lua). Its enqueue refuses a priority or a delay (enqueue.rs), which would
-- break that order.

-- The system switch of the queue: state ('active' | 'paused' | 'disabled') and system
-- name, set at run time by `gaffer system NAME …` in K_CONF; nil when none was set.
local function system_switch()
  local v = redis.call('HGET', K_CONF, 'system')
  if not v then return nil end
  return string.match(v, '^(%a+):(.*)$')
end

-- An ordered queue's retried head (K_CONF 'head', set by settle) back at the front of its
-- list once due; forgotten once it is no longer delayed (taken, cancelled, ready).
local function ordered_head_due(now)
  local head = redis.call('HGET', K_CONF, 'head')
  if not head then return end
  local due = redis.call('ZSCORE', K_DELAYED, head)
  if due and tonumber(due) > now then return end
  if due then
    redis.call('ZREM', K_DELAYED, head)
    local m = meta_of(head)
    if m then push_ready(parse_meta(m), {head}, true, tonumber(due) or now) end
  end
  redis.call('HDEL', K_CONF, 'head')
end

-- Whether a take must hand out nothing, and the hint for the idle taker: a paused or
-- disabled system (hint -1: its resume wakes takers), or, on an ordered queue, a requeue
-- of dead letters to its front with chunks to come (dead_move.lua; hint: when that hold
-- runs out, and its last chunk wakes takers), a lease in flight (hint: its expiry) or a
-- retried head not yet due (hint: its due time).
local function take_hold(now, configured, ordered)
  local state = system_switch() or configured
  if state == 'paused' or state == 'disabled' then return true, -1 end
  if not ordered then return false end
  local requeuing = tonumber(redis.call('HGET', K_CONF, 'requeuing'))
  if requeuing and requeuing > now then return true, requeuing - now end
  local lease = earliest_lease()
  if lease then return true, math.max(0, lease - now) end
  local head = redis.call('HGET', K_CONF, 'head')
  local due = head and redis.call('ZSCORE', K_DELAYED, head)
  if due then return true, math.max(0, tonumber(due) - now) end
  return false
end

-- ---------------------------------------------------------------------------------------
-- Long tasks (kind = "long", see long.lua). A cancel asked of a running one is kept in
-- K_CANCEL, id → note (who asked), until the task ends: its slot, which sees it at its
-- next renewal, stops the task and ends it cancelled, or its lease runs out (take).

-- Ends a leased long task whose cancel was asked: lease, task and cancel go, the record
-- says cancelled with the asker's note. A nil attempt or host: the record's last ones.
local function cancel_end(id, member, now, attempt, host, slot, ttl_ms)
  local note = redis.call('HGET', K_CANCEL, id) or ''
  redis.call('HDEL', K_CANCEL, id)
  redis.call('ZREM', K_LEASED, member)
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
  record(id, 'cancelled', now, attempt, host, slot, note, nil, ttl_ms)
end

-- Of expired lease members, ends those of long tasks whose cancel was asked (their slot
-- died before it could) and returns the others, which come back as usual.
local function end_expired_cancels(expired, now, ttl_ms)
  if redis.call('EXISTS', K_CANCEL) == 0 then return expired end
  local rest = {}
  for _, member in ipairs(expired) do
    local id = lease_parts(member)
    if redis.call('HEXISTS', K_CANCEL, id) == 1 then
      cancel_end(id, member, now, nil, nil, nil, ttl_ms)
    else
      rest[#rest + 1] = member
    end
  end
  return rest
end
