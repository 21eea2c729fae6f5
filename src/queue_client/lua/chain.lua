-- What chains need of a queue's tasks, read (or set) in one call for a batch's parents.
-- ARGV: op, then
--   op 'get': ids → per id {g, m}: its record's chain ('' none; false: no record) and its
--             max_attempts as enqueued ('' when the task is gone);
--   op 'set': pairs (id, chain) → sets the record's chain where it has none yet (a task
--             that became the global task of a chain by adding follow-ups). Returns how
--             many it set.
local op = ARGV[1]
if op == 'get' then
  local out = {}
  for i = 2, #ARGV do
    local id = ARGV[i]
    local v = redis.call('GET', rec_key(id))
    local g = false
    if v then
      local f = rec_parse(v)
      g = f[F.g] or ''
    end
    local meta = redis.call('HGET', K_META, id)
    local ma = ''
    if meta then ma = string.match(meta, '^[^:]*:([^:]*):') or '' end
    out[#out + 1] = g
    out[#out + 1] = ma
  end
  return out
end
local n = 0
for i = 2, #ARGV, 2 do
  local id, g = ARGV[i], ARGV[i + 1]
  local key = rec_key(id)
  local v = redis.call('GET', key)
  if v then
    local f, hist = rec_parse(v)
    if (f[F.g] or '') == '' then
      f[F.g] = g
      redis.call('SET', key, rec_pack(f, hist))
      n = n + 1
    end
  end
end
return n
