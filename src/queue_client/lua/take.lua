-- ARGV: the head (TakeHead in args.rs, read by name as A.n, …): n (0: bring back, take
-- nothing), lease_ms, housekeeping limit, host, slot,
-- history_ttl_ms (the taker's identity goes into the records of tracked tasks), the
-- config's system state ('paused' or ''; the run-time switch in K_CONF wins), ordered
-- ('1': one task at a time, see take_hold), failed routes ('1': the queue has `on =
-- "failed"` routes, and a lease that runs out at the last attempt comes back once more,
-- past max_attempts, for a slot to fail the task with them; a script cannot make them)
-- Returns a reply tagged by its kind (`parse_take` in lease.rs reads it):
--   {'a', now, token, expiry, id, attempt, payload, ...} tasks taken at any attempts;
--   {'f', now, token, expiry, {id, ...}, {payload, ...}} when every one is at its first
--     attempt (a number less per task to send, and no loop here);
--   {'b', now, token, expiry, framed, {payload, ...}} the same, leased as one batch (the
--     common case): the ids as the batch lease keeps them, FS id FS ... FS, one string
--     made anyway instead of a reply entry per id for Redis to write and the slot to read;
--   {'p', now, token, expiry, store, taken} tasks of one packet (see lib/blocks.lua: the
--     packet's store, and the waiting part of the tasks taken);
--   {'n', now, hint_ms} none: hint_ms = time until the next delayed task is due or the
--     next lease expires (-1: nothing scheduled), so an idle taker knows when to look
--     again.
local H = #TAKE_HEAD
local A = head(ARGV, TAKE_HEAD)
local now = now_ms()
local n, lease, limit = tonumber(A.n), tonumber(A.lease_ms), tonumber(A.limit)
local host, slot = A.host or '', A.slot or ''
-- An untracked queue has no index: it pays one EXISTS per take for records.
local tracked = redis.call('EXISTS', K_IDX) == 1

-- Steps 0 to 2 are the queue's housekeeping. A take that finds tasks ready skips them
-- while the last look found nothing to do less than QUIET_MS ago (K_CONF 'quiet': the
-- time until which takes may skip): under load, most looks find four empty ranges, and
-- they were about a tenth of Redis's work per task. What they wait for (a lease that
-- expired, a delayed task due, a record's end) is then at most QUIET_MS late, and only
-- while the queue has a backlog; a take of a queue with nothing ready, and a reclaim
-- (n = 0), always looks.
local QUIET_MS = 5
local quiet_until = tonumber(redis.call('HGET', K_CONF, 'quiet') or '0')
local sweep = n == 0 or quiet_until <= now or redis.call('EXISTS', K_READY) == 0
-- (what the look found to do: when nothing, the next takes may skip it)
local found = 0
if sweep then
  -- 0. Records whose time is up go (a bounded number, like everything here).
  if tracked then found = found + expire_records(now, limit) end

  -- 1. Expired leases come back here, so no separate reaper is needed. Each counts as a
  --    failed attempt (the attempt was counted when it was taken). They go to the front:
  --    they were taken before everything now waiting behind them.
  --    A batch lease that expired is split first: its tasks come back one by one as here
  --    (whole batches, until about `limit` tasks are out: the rest wait for the next take).
  found = found + batches_split_expired(now, limit)
  local expired = redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', now, 'LIMIT', 0, limit)
  -- (Long tasks whose cancel was asked end cancelled instead: their slot died first.)
  found = found + #expired
  if #expired > 0 then expired = end_expired_cancels(expired, now, history_ttl(A.history_ttl_ms)) end
  if #expired > 0 then
    local n_dead = 0
    local back, back_pris = {}, {}
    local expired_ids = {}
    for _, member in ipairs(expired) do
      local id = lease_parts(member)
      expired_ids[#expired_ids + 1] = id
      local a = attempts_of(redis.call('HGET', K_ATT, id)) + 1
      local m = meta_of(id)
      if m then
        -- (a lease whose task is gone counts no attempt: nothing would ever delete it)
        redis.call('HSET', K_ATT, id, a)
        local pri, ma = parse_meta(m)
        local last = ma > 0 and a >= ma
        -- (on a queue with failed routes the last attempt comes back once more, see ARGV)
        local once_more = last and A.failed_routes == '1' and a == ma
        if last and not once_more then
          local err = string.format('lease expired on attempt %d of %d (max_attempts reached)', a, ma)
          redis.call('ZADD', K_DEAD, now, id)
          redis.call('HSET', K_ERR, id, err)
          n_dead = n_dead + 1
          if tracked then record(id, 'failed', now, a, nil, nil, err, {e = err}, history_ttl(A.history_ttl_ms)) end
        else
          local err = string.format('lease expired on attempt %d', a)
          if once_more then
            err = string.format('lease expired on attempt %d of %d (max_attempts reached): '
              .. 'failed with its failed routes at its next take', a, ma)
          end
          back[#back + 1] = id
          back_pris[#back_pris + 1] = pri
          redis.call('HSET', K_ERR, id, err)
          if tracked then record(id, 'waiting', now, a, nil, nil, err, {e = err, d = now}) end
        end
      end
    end
    bulk('ZREM', K_LEASED, expired)
    run_end(expired_ids)
    -- At the front in the leases' order (earliest expiry first, then by token and id).
    push_ready_grouped(back_pris, back, true, now)
    redis.call('HINCRBY', K_STATS, 'expired', #expired)
    if n_dead > 0 then redis.call('HINCRBY', K_STATS, 'dead', n_dead) end
  end
end

-- 1b. An ordered queue's retried head comes back to the front when due (before step 2,
--     which would put it at the back).
if A.ordered == '1' then ordered_head_due(now) end

if sweep then
  -- 2. Delayed tasks that are due join the back of their priority's list, in due order.
  --    Each keeps its due time, from which its lateness counts (ready_dues).
  local due = redis.call('ZRANGEBYSCORE', K_DELAYED, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  found = found + #due
  if #due > 0 then
    local all = {}
    for i = 1, #due, 2 do all[#all + 1] = due[i] end
    local metas = metas_of(all)
    local ids, pris, dues = {}, {}, {}
    for i, id in ipairs(all) do
      if metas[i] then
        ids[#ids + 1] = id
        pris[#pris + 1] = parse_meta(metas[i])
        dues[#dues + 1] = due[2 * i]
      end
    end
    bulk('ZREM', K_DELAYED, all)
    push_ready_grouped(pris, ids, false, dues)
  end
  if found == 0 then
    redis.call('HSET', K_CONF, 'quiet', now + QUIET_MS)
  elseif quiet_until > now then
    redis.call('HDEL', K_CONF, 'quiet')
  end
end

-- n = 0: only the steps above (a reclaim, see lease.rs), and the hint of none taken.
if n == 0 then return {'n', now, -1} end

-- 3. Hand out up to n, highest priority first, FIFO within a priority; nothing while
--    held (a paused or disabled system; an ordered queue's head running or not yet due).
local held, held_hint = take_hold(now, A.system or '', A.ordered == '1')
if held then return {'n', now, held_hint} end
if A.ordered == '1' then n = 1 end
local ids = {}
-- A packet's entry (see lib/blocks.lua) at the head of a list is taken alone: a take hands
-- out plain tasks or tasks of one packet, never both. Only a queue that has packets looks
-- at what it takes before it takes it.
local has_packets = tracked and queue_has_packets()
local dues_kept = ready_dues.kept()
local packet_list, packet_name = nil, nil
while #ids < n do
  local top = redis.call('ZRANGE', K_READY, 0, 0)[1]
  if not top then break end
  local asked = n - #ids
  local want = asked
  local list = ready_list(top)
  local stop = false
  -- (LRANGE, not LINDEX: a command every role's ACL line grants, docs/SECURITY.md)
  local head = has_packets and redis.call('LRANGE', list, 0, 0)[1]
  if head and is_packet_name(head) then
    -- (a queue fed by a chain's step holds mostly packets: one look)
    stop = true
    if #ids == 0 then packet_list, packet_name = list, head end
    want = 0
  elseif has_packets then
    local plain = 0
    for _, e in ipairs(redis.call('LRANGE', list, 0, want - 1)) do
      if is_packet_name(e) then
        stop = true
        if plain == 0 and #ids == 0 then packet_list, packet_name = list, e end
        break
      end
      plain = plain + 1
    end
    want = plain
  end
  local got = want > 0 and redis.call('LPOP', list, want)
  if got and dues_kept then ready_dues.drop(got) end
  if got then
    if #ids == 0 then
      ids = got
    else
      for _, id in ipairs(got) do ids[#ids + 1] = id end
    end
  end
  -- (a packet's entry ends what this take hands out)
  if stop then break end
  -- fewer than asked means the list is now empty
  if not got or #got < asked then redis.call('ZREM', K_READY, top) end
end
local k = #ids
-- A lease token is never handed out twice, not even after Redis lost a take it had
-- acknowledged (a restart with `appendfsync everysec`, a failover to a replica that had
-- not received it), which sets the counter back: a token is at least Redis's clock in
-- µs, which moved on meanwhile, so the slot that holds the lost one finds its lease gone
-- (its settle stale, its renewal refused) rather than shared with the next taker. As
-- text wherever it is joined (Lua prints a number this long in exponent form).
local function new_token()
  local tok = math.max((tonumber(redis.call('GET', K_TOK)) or 0) + 1, now_us())
  local tok_s = string.format('%d', tok)
  redis.call('SET', K_TOK, tok_s)
  return tok, tok_s
end
if packet_list then
  local tok, tok_s = new_token()
  local exp = now + lease
  local store, taken = packet_take(packet_list, packet_name, n, tok_s,
    string.format('%d', exp), now, host, slot)
  if redis.call('EXISTS', K_READY) == 1 and redis.call('LLEN', packet_list) == 0 then
    redis.call('ZREM', K_READY, string.match(packet_list, ':(%-?%d+)$'))
  end
  -- (a packet gone from under its entry, which went: look again at once)
  if not store then return {'n', now, 0} end
  -- (wake-ups as for plain tasks, below)
  if redis.call('EXISTS', K_READY) == 0 then
    redis.call('DEL', K_WAKE)
  elseif tonumber(string.match(taken, '^%d+')) == n then
    wake(1)
  end
  return {'p', now, tok, exp, store, taken}
end
if k == 0 then
  -- Nothing ready: wake-ups still listed are spent (their tasks were taken), and each
  -- would send an idle taker on another empty take.
  redis.call('DEL', K_WAKE)
  local hint = -1
  local d = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
  if d[2] then hint = math.max(0, tonumber(d[2]) - now) end
  local lease = earliest_lease()
  if lease then
    local h = math.max(0, lease - now)
    if hint < 0 or h < hint then hint = h end
  end
  return {'n', now, hint}
end
local tok, tok_s = new_token()
local exp = now + lease
-- The score as text, made once: a number handed to redis.call is printed with printf
-- and parsed back, per member.
local exp_s = string.format('%d', exp)
-- Attempts are only looked up when some task has failed one: the common queue, where
-- tasks succeed first time, never reads K_ATT on this path.
local atts, first = {}, true
if redis.call('EXISTS', K_ATT) == 1 then
  atts = hmget(K_ATT, ids)
  for i = 1, k do
    local a = (tonumber(atts[i]) or 0) + 1
    atts[i] = a
    if a ~= 1 then first = false end
  end
end
-- All first attempts, one at a time not asked: one batch lease (see lib/blocks.lua).
local framed = first and A.ordered ~= '1' and batch_lease(tok_s, exp_s, ids, now, host, slot)
if not framed then
  if first then
    for i = 1, k do atts[i] = 1 end
  end
  local leased = {}
  local prefix = tok_s .. ':'
  for i, id in ipairs(ids) do
    leased[2 * i - 1] = exp_s
    leased[2 * i] = prefix .. id
  end
  bulk('ZADD', K_LEASED, leased)
  -- (asked again: this take's sweep may have expired the queue's last record, and with it
  -- the index, after which no settle would read or delete a running entry)
  if tracked and redis.call('EXISTS', K_IDX) == 1 then run_begin(ids, now, atts, host, slot) end
end
-- Each value is the task's meta, a newline and its payload (see task_value).
local payloads = hmget(K_PAYLOAD, ids)
local out
if framed then
  out = {'b', now, tok, exp, framed, payloads}
elseif not first then
  out = {'a', now, tok, exp}
  for i, id in ipairs(ids) do
    out[3 * i + 2] = id
    out[3 * i + 3] = atts[i]
    out[3 * i + 4] = payloads[i]
  end
else
  -- Redis turns the tables into nested arrays: no loop over the tasks here.
  out = {'f', now, tok, exp, ids, payloads}
end
if redis.call('EXISTS', K_READY) == 0 then
  -- This take emptied the queue: the wake-ups listed for its tasks are spent (a queue fed
  -- a batch at a time, like a chain's next step, otherwise sent its idle takers on an
  -- empty take per task enqueued).
  redis.call('DEL', K_WAKE)
elseif k == n then
  -- A full batch with more waiting: wake a peer, so backlog spreads over idle takers.
  wake(1)
end
return out
