-- ARGV: the head (DeadMoveHead in args.rs, read by name as A.action, …): action ('requeue' | 'purge'; 'requeue_front' on an ordered queue, whose
-- requeued tasks go before everything waiting, as they were created before it, and
-- 'requeue_front_more' for a chunk of given ids that more chunks, older ones, follow: the
-- queue's takes are held meanwhile, see REQUEUE_HOLD_MS), limit,
-- note (the requeued records' history note), cutoff (ms, by Redis's clock), owner (with
-- ids: only letters whose record names this submitter, an api key moving its own; '' :
-- anyone's), then ids
-- (none: the oldest `limit` dead letters that died by the cutoff: a sweep of all of them
-- takes those there when it began, not the ones that die while it runs, which a handler
-- that fails at once would feed it for ever, each requeued with its attempts reset).
-- Returns how many were moved. Requeued tasks start afresh: zero attempts, no last error
-- (an ack only cleans up the error of tasks past their first attempt).
local now = now_ms()
local H = #DEAD_MOVE_HEAD
local A = head(ARGV, DEAD_MOVE_HEAD)
local action, lim, cutoff = A.action, tonumber(A.limit), A.cutoff_ms
local front = action == 'requeue_front' or action == 'requeue_front_more'
-- A requeue to the front in chunks puts the newest dead letters there first and the
-- oldest last: a take between two chunks would run newer tasks before older ones. So an
-- ordered queue takes nothing while chunks are to come (take_hold), for at most this long
-- should the requeue stop half way (the chunks come one round trip apart).
local REQUEUE_HOLD_MS = 10000
local ids = {}
if #ARGV > H then
  -- (an id given twice is moved once: twice in a ready list, it would run twice)
  local seen = {}
  for i = H + 1, #ARGV do
    local id = ARGV[i]
    if not seen[id] and redis.call('ZSCORE', K_DEAD, id) and rec_owned_by(id, A.owner) then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
elseif front then
  -- the newest first, each call's ahead of the last's: the oldest end up at the front
  local newest = redis.call('ZRANGE', K_DEAD, cutoff, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, lim)
  for i = #newest, 1, -1 do ids[#ids + 1] = newest[i] end
else
  ids = redis.call('ZRANGE', K_DEAD, '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, lim)
end
if front then
  local more = action == 'requeue_front_more'
    or (#ARGV == H and #ids == lim and redis.call('ZCOUNT', K_DEAD, '-inf', cutoff) > #ids)
  if more then
    redis.call('HSET', K_CONF, 'requeuing', now + REQUEUE_HOLD_MS)
  else
    redis.call('HDEL', K_CONF, 'requeuing')
  end
end
if #ids == 0 then return 0 end
bulk('ZREM', K_DEAD, ids)
if action == 'purge' then
  forget(ids)
  redis.call('HINCRBY', K_STATS, 'purged', #ids)
else
  local metas = metas_of(ids)
  local pris = {}
  for i = 1, #ids do pris[i] = parse_meta(metas[i]) end
  push_ready_grouped(pris, ids, front, now)
  bulk('HDEL', K_ATT, ids)
  bulk('HDEL', K_ERR, ids)
  for _, id in ipairs(ids) do
    -- back in the queue: its record lives again as long as the task (stored without TTL)
    record(id, 'waiting', now, 0, '', '', A.note, {d = now})
  end
  redis.call('HINCRBY', K_STATS, 'requeued', #ids)
  wake(#ids)
end
return #ids
