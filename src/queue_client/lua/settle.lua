-- ARGV: the head (SettleHead in args.rs, read by name as A.k1, …): k1, k2, host, slot,
-- history_ttl_ms, ordered ('1': a retry keeps its place at the
-- head, see take_hold), the token of the first attempts' acks ('' when k1 is 0), the
-- sequence numbers of their records as runs "s1-s2,..." ('' when some has none: see
-- "Runs" in lib/blocks.lua; a tracked queue's acks of one whole batch then write no
-- record), then k1
-- acks of first attempts holding that token as their ids (a slot settles one batch, so
-- one token; an id and a token per task was two strings for Lua to make), k2 acks of
-- other attempts or tokens as (id, token, attempt) (only those can have attempts and a
-- last error to clean up); then m other ops as (kind, id, token, attempt, a, b, c):
--   'e' extend (a = lease_ms);  'r' retry (a = delay_ms, b = priority or '', c = reason);
--   'f' fail (a = reason);  'd' done with a result (a = the result, JSON text)
-- Returns k1 + k2 + m results in that order: 1 done, 0 stale (no lease with this token:
-- it expired and was reclaimed, or was settled or cancelled), 2 retry turned into a dead
-- letter because max_attempts is reached; or {} when every one is 1 (the common case, a
-- number less per task to send).
local H = #SETTLE_HEAD
local A = head(ARGV, SETTLE_HEAD)
local now = now_ms()
local k1, k2 = tonumber(A.k1), tonumber(A.k2)
local host, slot, ttl = A.host, A.slot, tonumber(A.history_ttl_ms)
local ordered = A.ordered == '1'
local tracked = redis.call('EXISTS', K_IDX) == 1
local k = k1 + k2
-- A slot's steady state: the call acks exactly one batch lease, whole and in take order
-- (see lib/blocks.lua). No per-task lease to check or remove, no running entry to read.
if k1 > 0 and ARGN == H + k1 and k1 <= CHUNK then
  local at, thost, tslot = batch_ack_whole(A.token, ARGV, H + 1, H + k1)
  if at then
    redis.call('HDEL', K_PAYLOAD, unpack(ARGV, H + 1, H + k1))
    redis.call('HINCRBY', K_STATS, 'acked', k1)
    if tracked then
      local runs = A.runs ~= '' and done_runs(A.runs, k1)
      if runs then
        records_done_runs(runs, at, thost, tslot, now, host, slot, ttl)
        if redis.call('EXISTS', K_WATCH) == 1 then tell_watchers({unpack(ARGV, H + 1, H + k1)}) end
      else
        records_done({unpack(ARGV, H + 1, H + k1)}, at .. FS .. '1' .. FS .. thost .. FS .. tslot .. FS,
          now, 1, host, slot, ttl)
      end
    end
    return {}
  end
end
local members, ids, atts = {}, {}, {}
local prefix = A.token .. ':'
for i = 1, k1 do
  local id = ARGV[H + i]
  ids[i] = id
  members[i] = prefix .. id
  atts[i] = 1
end
local o = H + k1
for i = k1 + 1, k do
  ids[i] = ARGV[o + 1]
  members[i] = ARGV[o + 2] .. ':' .. ids[i]
  atts[i] = tonumber(ARGV[o + 3])
  o = o + 3
end
-- Where the other ops start.
local BASE = o
local m = (ARGN - BASE) / 7
for j = 1, m do
  local oo = BASE + (j - 1) * 7
  ids[k + j] = ARGV[oo + 2]
  members[k + j] = ARGV[oo + 3] .. ':' .. ids[k + j]
end
-- Anything else works on per-task leases: the batches it names are split first.
if batch_leases_held() then
  local toks = {}
  if k1 > 0 then toks[1] = A.token end
  for x = k1 + 1, k + m do toks[#toks + 1] = string.match(members[x], '^(%d+):') end
  batches_split(toks)
end
-- The fence. Every lease named here is moved to -inf with ZADD XX CH: only held ones
-- move, so the count says whether all are held, and only when some are not (stale, or
-- named twice) does the script ask which (those now at -inf). ZMSCORE answered with a
-- double per member, each printed with printf: a tenth of Redis's work per task. A lease
-- at -inf belongs to this call, which removes it or gives it a new expiry before it
-- returns (and had one stayed, the next take would reclaim it as expired).
local held = {}
local moved = 0
local i = 1
while i <= #members do
  local j = math.min(i + CHUNK - 1, #members)
  local zargs = {}
  for x = i, j do
    zargs[2 * (x - i) + 1] = '-inf'
    zargs[2 * (x - i) + 2] = members[x]
  end
  moved = moved + redis.call('ZADD', K_LEASED, 'XX', 'CH', unpack(zargs))
  i = j + 1
end
if moved == #members then
  for x = 1, #members do held[x] = true end
else
  local at = {}
  for _, mem in ipairs(redis.call('ZRANGEBYSCORE', K_LEASED, '-inf', '-inf')) do at[mem] = true end
  for x = 1, #members do held[x] = at[members[x]] end
end
local function dead_letter(id, attempt, err)
  redis.call('ZADD', K_DEAD, now, id)
  redis.call('HSET', K_ERR, id, err)
  if tracked then record(id, 'failed', now, attempt, host, slot, err, {e = err}, ttl) end
end

local res, acked, acked_members, later, settled = {}, {}, {}, {}, {}
-- Leases an 'e' op gave a new expiry in this call.
local extended = {}
-- Acks of the fast path, recorded together; attempts known only for first attempts.
local fast_done, fast_att = {}, {}
local n_stale, n_retried, n_dead, n_woken = 0, 0, 0, 0
for i = 1, k do
  local id = ids[i]
  if not held[i] or settled[id] then
    res[i] = 0
    n_stale = n_stale + 1
  else
    settled[id] = true
    acked[#acked + 1] = id
    acked_members[#acked_members + 1] = members[i]
    if i > k1 then later[#later + 1] = id end
    fast_done[#fast_done + 1] = id
    fast_att[#fast_done] = atts[i]
    res[i] = 1
  end
end
for i = k + 1, k + m do
  local o = BASE + (i - k - 1) * 7
  local kind, id, attempt = ARGV[o + 1], ids[i], tonumber(ARGV[o + 4])
  if not held[i] or settled[id] then
    res[i] = 0
    n_stale = n_stale + 1
  elseif kind == 'e' then
    redis.call('ZADD', K_LEASED, 'XX', now + tonumber(ARGV[o + 5]), members[i])
    extended[members[i]] = true
    res[i] = 1
  elseif kind == 'd' then
    settled[id] = true
    acked[#acked + 1] = id
    acked_members[#acked_members + 1] = members[i]
    -- Extended earlier in this call, so no longer at -inf: by name.
    if extended[members[i]] then redis.call('ZREM', K_LEASED, members[i]) end
    later[#later + 1] = id
    if tracked then record(id, 'done', now, attempt, host, slot, '', {r = ARGV[o + 5]}, ttl) end
    res[i] = 1
  else
    settled[id] = true
    redis.call('ZREM', K_LEASED, members[i])
    redis.call('HSET', K_ATT, id, attempt)
    if kind == 'f' then
      dead_letter(id, attempt, ARGV[o + 5])
      n_dead = n_dead + 1
      res[i] = 1
    else
      local meta = meta_of(id)
      local pri, ma = parse_meta(meta)
      local reason = ARGV[o + 7]
      if ma > 0 and attempt >= ma then
        if reason == '' then reason = 'retry requested' end
        dead_letter(id, attempt, string.format(
          'attempt %d of %d failed (max_attempts reached): %s', attempt, ma, reason))
        n_dead = n_dead + 1
        res[i] = 2
      else
        local set = {}
        -- An ordered queue keeps one order: a retry's new priority is ignored there.
        if ARGV[o + 6] ~= '' and not ordered then
          pri = tonumber(ARGV[o + 6])
          set_meta(id, meta_with_priority(meta, pri))
          set.p = pri
        end
        if reason ~= '' then
          redis.call('HSET', K_ERR, id, reason)
          set.e = reason
        end
        local delay = tonumber(ARGV[o + 5])
        if ordered then
          -- The head keeps its place: nothing behind it is taken until it is due again.
          redis.call('HSET', K_CONF, 'head', id)
        end
        if delay > 0 then
          redis.call('ZADD', K_DELAYED, now + delay, id)
        else
          push_ready(pri, {id}, ordered, now)
          n_woken = n_woken + 1
        end
        if tracked then
          set.d = now + delay
          record(id, 'waiting', now, attempt, host, slot, reason ~= '' and reason or 'retry requested', set)
        end
        n_retried = n_retried + 1
        res[i] = 1
      end
    end
  end
end
if tracked then record_done_many(fast_done, now, fast_att, host, slot, ttl) end
-- What is still at -inf is exactly the acks' leases (retries and fails removed theirs by
-- name, extends gave theirs a time, stale ones never moved): one range, no argument per
-- task. (An ACL without the command is refused at the master's start:
-- `check_settle_commands`.)
if #acked_members > 0 then redis.call('ZREMRANGEBYSCORE', K_LEASED, '-inf', '-inf') end
if #acked > 0 then
  bulk('HDEL', K_PAYLOAD, acked)
  bulk('HDEL', K_ATT, later)
  bulk('HDEL', K_ERR, later)
  redis.call('HINCRBY', K_STATS, 'acked', #acked)
end
if n_stale > 0 then redis.call('HINCRBY', K_STATS, 'stale', n_stale) end
if n_retried > 0 then redis.call('HINCRBY', K_STATS, 'retried', n_retried) end
if n_dead > 0 then redis.call('HINCRBY', K_STATS, 'dead', n_dead) end
-- An ordered queue's takes wait while a task is leased: one that ended frees the next,
-- and a taker waiting on the lease's hint (another slot, as slots change hands) is woken.
if ordered and n_woken == 0 and (#acked > 0 or n_dead > 0) and redis.call('EXISTS', K_READY) == 1 then
  n_woken = 1
end
wake(n_woken)
for x = 1, k + m do
  if res[x] ~= 1 then return res end
end
return {}
