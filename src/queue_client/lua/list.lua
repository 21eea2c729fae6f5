-- ARGV: the head (ListHead in args.rs, read by name as A.submitter, …): submitter ('' =
-- every record), state ('' = any), cursor (a score: entries below it; '' = from the
-- newest), limit, scan cap (index entries looked at, at most: what bounds the call's
-- work, see LIST_CALL_BUDGET in record.rs), page bytes (records' bytes after which the
-- call stops).
-- Returns {next cursor or '', then per record: id, s, p, a, m, c, d, u, b, e, r}, newest
-- first. Writes nothing (see rec_visible): index entries of records whose time is up are
-- passed over, and go with their records at the next sweep. A page may hold
-- fewer than `limit` records while the cursor still goes on (the scan cap was reached
-- among records of other states, or the page's bytes reached PAGE_BYTES): the client
-- follows it.
local A = head(ARGV, LIST_HEAD)
local by, want, cursor = A.submitter, A.state, A.cursor
local limit, cap = tonumber(A.limit), tonumber(A.cap)
local idx = K_IDX
if by ~= '' then idx = submitter_index(by) end
local top = '+inf'
if cursor ~= '' then top = '(' .. cursor end
local now = now_ms()
-- The most bytes of records one call returns, about: results and errors can be large (a
-- result up to the queue's max_result), and a reply is built whole in Redis's memory.
local PAGE_BYTES = tonumber(A.page_bytes) or 4 * 1024 * 1024
local bytes, full = 0, false
-- (also the batches read once for every record of the page, see batch_run_of)
local due = {many = true}
local out = {''}
local found, looked = 0, 0
local last, exhausted = nil, false
while found < limit and looked < cap and not full do
  local ask = math.min(cap - looked, 200)
  local rows = redis.call('ZRANGE', idx, top, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, ask, 'WITHSCORES')
  local used = 0
  for i = 1, #rows, 2 do
    local id = rows[i]
    used = used + 1
    last = rows[i + 1]
    local v = rec_visible(id, now, due)
    -- (a submitter's index entry left by a gaffer before records_new cleaned them up: the
    -- id now holds another submitter's task)
    if v and by ~= '' and rec_submitter(v) ~= by then v = nil end
    local r = v and rec_current(id, v, due)
    if r and (want == '' or r[1] == want) then
      out[#out + 1] = id
      for j = 1, REC_VIEW_FIELDS do
        out[#out + 1] = r[j]
        if type(r[j]) == 'string' then bytes = bytes + #r[j] end
      end
      found = found + 1
      full = bytes >= PAGE_BYTES
      if found == limit or full then break end
    end
  end
  looked = looked + used
  if not full and found < limit and #rows / 2 < ask then
    exhausted = true
    break
  end
  if last then top = '(' .. last end
end
if last and not exhausted then
  -- Anything below the last entry looked at makes a next page.
  local more = redis.call('ZRANGE', idx, '(' .. last, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
  if #more > 0 then out[1] = last end
end
return out
