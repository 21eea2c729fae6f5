-- ARGV: id, watch ('1': mark that an api instance waits for the task's end, unless it has
-- ended already). Returns nil when the task has no record, else the fields
-- {s, p, a, m, c, d, u, b, e, r, h} (see prelude.lua).
local key = rec_key(ARGV[1])
local r = redis.call('HMGET', key, 's', 'p', 'a', 'm', 'c', 'd', 'u', 'b', 'e', 'r', 'h')
if not r[1] then return nil end
if ARGV[2] == '1' and redis.call('TTL', key) < 0 then redis.call('HSET', key, 'w', '1') end
return r
