-- Leases handed back unstarted: a prefetched batch a stopping slot never began, or one
-- whose lease ran out before its handler was free. Each task goes back to the front of its
-- priority's list (it was taken before everything behind it). No attempt is counted: a
-- take counts nothing in K_ATT (only an ended attempt does), so the next take hands the
-- task out at the same attempt.
-- ARGV: (id, token, attempt) triples. Returns one code per task: 1 returned, 0 stale (no
-- lease with this token: it expired and was reclaimed, or was settled or cancelled).
local now = now_ms()
local tracked = redis.call('EXISTS', K_IDX) == 1
local res, back, pris = {}, {}, {}
for i = 1, #ARGV, 3 do
  local id, attempt = ARGV[i], tonumber(ARGV[i + 2])
  local m = redis.call('HGET', K_META, id)
  if m and redis.call('ZREM', K_LEASED, ARGV[i + 1] .. ':' .. id) == 1 then
    back[#back + 1] = id
    pris[#pris + 1] = parse_meta(m)
    -- The record's last entry is this take's `running`: a `waiting` one after it says the
    -- attempt was given back, not run.
    if tracked then record(id, 'waiting', now, attempt - 1, nil, nil, 'returned unstarted', nil) end
    res[#res + 1] = 1
  else
    res[#res + 1] = 0
  end
end
push_ready_grouped(pris, back, true)
run_end(back)
wake(#back)
return res
