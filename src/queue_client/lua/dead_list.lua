-- ARGV: the head (DeadListHead in args.rs): offset, limit. Returns limit × (id, died_ms, attempts, payload, error, meta), oldest first.
local A = head(ARGV, DEAD_LIST_HEAD)
local off, lim = tonumber(A.offset), tonumber(A.limit)
local rows = redis.call('ZRANGE', K_DEAD, off, off + lim - 1, 'WITHSCORES')
local out = {}
for i = 1, #rows, 2 do
  local id = rows[i]
  out[#out + 1] = id
  out[#out + 1] = tonumber(rows[i + 1])
  out[#out + 1] = attempts_of(redis.call('HGET', K_ATT, id))
  local m, payload = task_of(id)
  out[#out + 1] = payload or ''
  out[#out + 1] = redis.call('HGET', K_ERR, id) or ''
  out[#out + 1] = m or ''
end
return out
