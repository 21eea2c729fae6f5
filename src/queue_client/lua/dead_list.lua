-- ARGV: the head (DeadListHead in args.rs): offset, limit, newest, after_ms, after_id,
-- page_bytes. Oldest first (newest = 0): `limit` from the `offset`-th. Newest first
-- (newest = 1): `limit` from the newest, or after the letter a cursor names by its time
-- of death and id (after_ms, after_id; after_ms '' : from the newest), ending early once
-- the reply holds page_bytes (at least one letter). Returns `more` (1 when letters follow
-- the last one returned, in its order), then per letter (id, died_ms, attempts, payload,
-- error, meta).
local A = head(ARGV, DEAD_LIST_HEAD)
local lim = tonumber(A.limit)
-- Byte order, as a zset orders members of one score (Lua's own `<` follows the server's
-- locale).
local function before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local rows, start
if A.newest ~= '1' then
  start = tonumber(A.offset)
  rows = redis.call('ZRANGE', K_DEAD, start, start + lim - 1, 'WITHSCORES')
else
  -- Newest first is by score, then by id, both descending: the cursor's place is the
  -- letters that died after it plus those of its millisecond from its id up (whether it
  -- is still there or was requeued or purged since), so letters that die meanwhile or
  -- leave shift no page onto another.
  start = 0
  if A.after_ms ~= '' then
    start = redis.call('ZCOUNT', K_DEAD, '(' .. A.after_ms, '+inf')
    for _, id in ipairs(redis.call('ZRANGE', K_DEAD, A.after_ms, A.after_ms, 'BYSCORE')) do
      if not before(id, A.after_id) then start = start + 1 end
    end
  end
  rows = redis.call('ZRANGE', K_DEAD, start, start + lim - 1, 'REV', 'WITHSCORES')
end
local out = {0}
local bytes, budget, n = 0, tonumber(A.page_bytes), 0
for i = 1, #rows, 2 do
  local id = rows[i]
  local m, payload = task_of(id)
  local err = redis.call('HGET', K_ERR, id) or ''
  out[#out + 1] = id
  out[#out + 1] = tonumber(rows[i + 1])
  out[#out + 1] = attempts_of(redis.call('HGET', K_ATT, id))
  out[#out + 1] = payload or ''
  out[#out + 1] = err
  out[#out + 1] = m or ''
  n = n + 1
  bytes = bytes + #(payload or '') + #err
  if A.newest == '1' and bytes >= budget then break end
end
if start + n < redis.call('ZCARD', K_DEAD) then out[1] = 1 end
return out
