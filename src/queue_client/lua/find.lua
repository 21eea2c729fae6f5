-- ARGV: the head (FindHead in args.rs, read by name as A.id, …): id, cancel ('1' removes
-- the task), note (the cancelled record's history note), history_ttl_ms, the queue's kind
-- ('long': a running task is asked to stop, state 'cancelling', rather than removed), a
-- system ('' none: the sweep of a disable cancels only a waiting task, and only while the
-- queue's switch says that system is disabled), an owner ('' any: else only a task whose
-- record names it as its submitter, so a caller that checked who may act on the task acts
-- on that task, not one submitted since), whether to leave a dead letter as it is ('1':
-- it failed, it has ended; a cancel asked before it failed must not turn its failure into
-- a cancel and delete the dead letter).
-- Returns nil when unknown (or, for a sweep, not cancelled; or not the owner's), else
-- {state, score, meta, attempts, payload, error, lease token or ''}; a leased task's
-- attempts count the one under way.
local A = head(ARGV, FIND_HEAD)
local now = now_ms()
local id = A.id
local sweep = A.system or ''
if not rec_owned_by(id, A.owner or '') then return nil end
if sweep ~= '' then
  local st, name = system_switch()
  if st ~= 'disabled' or name ~= sweep then return nil end
end
-- A cancel changes the lease: a batch holding it is split first (see lib/blocks.lua).
-- (a sweep splits no batch; a cancel, a sweep's too, takes a waiting task out of its packet)
local state, score, m, member, tok, payload = locate(id, now, A.cancel == '1' and sweep == '',
  A.cancel == '1')
if not state then return nil end
if sweep ~= '' and state ~= 'ready' and state ~= 'due' and state ~= 'delayed' then return nil end
local cancel = A.cancel == '1' and not (state == 'dead' and A.keep_dead == '1')
local attempts = attempts_of(redis.call('HGET', K_ATT, id))
if state == 'leased' then attempts = attempts + 1 end
local out = {
  state == 'due' and 'ready' or state, score, m, attempts,
  select(2, task_of(id)) or payload or '',
  redis.call('HGET', K_ERR, id) or '',
  tok or '',
}
if state == 'leased' and redis.call('HEXISTS', K_CANCEL, id) == 1 then out[1] = 'cancelling' end
if cancel and state == 'leased' and A.kind == 'long' then
  -- A running long task is stopped by its slot, which sees the cancel at its next renewal
  -- (long.lua) and ends the task cancelled once it has let it go.
  -- (HEXISTS and HSET: commands every role's ACL line grants, docs/SECURITY.md)
  if redis.call('HEXISTS', K_CANCEL, id) == 0 then
    redis.call('HSET', K_CANCEL, id, A.note or '')
    record(id, 'cancelling', now, nil, nil, nil, A.note or '')
  end
  out[1] = 'cancelling'
elseif cancel then
  redis.call('HDEL', K_CANCEL, id)
  if state == 'ready' then
    -- O(length of the list): cancelling is rare, and a ready task must leave no entry
    -- behind that could hand it out after its id is enqueued again.
    ready_remove(parse_meta(m), id)
  elseif state == 'leased' then
    redis.call('ZREM', K_LEASED, member)
  else
    redis.call('ZREM', K_DELAYED, id)
    redis.call('ZREM', K_DEAD, id)
    redis.call('ZREM', K_FROZEN, id)
  end
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
  record(id, 'cancelled', now, nil, '', '', A.note or '', nil, history_ttl(A.history_ttl_ms))
  -- On an ordered queue a lease, or a retried head not yet due, holds every take, and its
  -- idle takers sleep on that hold's hint: one cancelled frees the next task at once.
  if (state == 'leased' or state == 'delayed' or state == 'due')
      and redis.call('EXISTS', K_READY) == 1 then
    wake(1)
  end
end
return out
