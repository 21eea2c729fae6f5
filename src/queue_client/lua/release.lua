-- Leases handed back unstarted: a prefetched batch a stopping slot never began, one
-- whose lease ran out before its handler was free, or the rest of a batch its handler left
-- unstarted when the slot was asked to stop. Each task goes back to the front of its
-- priority's list (it was taken before everything behind it). No attempt is counted: a
-- take counts nothing in K_ATT (only an ended attempt does), so the next take hands the
-- task out at the same attempt.
-- A long task whose cancel was asked while it ran ends cancelled here, as a lease that
-- runs out does (end_expired_cancels): handed back, it would start again on another slot
-- before its cancel was seen.
-- A long task its slot stopped before it ended (a drain, a smaller map) did run: its
-- record keeps the run and says why it waits again (the note), at the attempts it had
-- used before (none counted for this one: the next run has the same number).
-- ARGV: the head (ReleaseHead in args.rs, read by name as A.note, …): history_ttl_ms,
-- note ('' for tasks that never started), host, slot; then (id, token, attempt) triples. Returns one code per task: 1 returned (or ended cancelled), 0
-- stale (no lease with this token: it expired and was reclaimed, or was settled or
-- cancelled).
local H = #RELEASE_HEAD
local A = head(ARGV, RELEASE_HEAD)
local FIRST = H + 1
local note = A.note
local toks = {}
for i = FIRST + 1, #ARGV, 3 do toks[#toks + 1] = ARGV[i] end
batches_split(toks)
local cancels = redis.call('EXISTS', K_CANCEL) == 1
local now = (cancels or note ~= '') and now_ms()
local res, back, pris, atts = {}, {}, {}, {}
for i = FIRST, #ARGV, 3 do
  local id = ARGV[i]
  local member = ARGV[i + 1] .. ':' .. id
  local m = meta_of(id)
  if cancels and m and redis.call('HEXISTS', K_CANCEL, id) == 1
      and redis.call('ZSCORE', K_LEASED, member) then
    cancel_end(id, member, now, nil, nil, nil, history_ttl(A.history_ttl_ms))
    res[#res + 1] = 1
  elseif m and redis.call('ZREM', K_LEASED, member) == 1 then
    back[#back + 1] = id
    atts[#atts + 1] = tonumber(ARGV[i + 2])
    pris[#pris + 1] = parse_meta(m)
    res[#res + 1] = 1
  else
    res[#res + 1] = 0
  end
end
-- At the front, in the order they were taken, ahead of everything that was behind them.
push_ready_grouped(pris, back, true, now or now_ms())
-- The take's running entries are still beside the records: a take that never ran goes
-- unwritten, so the record keeps no trace of it.
if note == '' then
  run_end(back)
else
  for k, id in ipairs(back) do
    -- (an untracked task has no record: record() only drops its running entry)
    record(id, 'waiting', now, math.max(atts[k] - 1, 0), A.host, A.slot, note)
  end
end
wake(#back)
return res
