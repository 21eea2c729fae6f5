-- ARGV: id, watch ('1': mark that an api instance waits for the task's end, unless it has
-- ended already). Returns nil when the task has no record, else the fields
-- {s, p, a, m, c, d, u, b, e, r, h} (see prelude.lua).
local key = rec_key(ARGV[1])
local v = redis.call('GET', key)
if not v then return nil end
local f, hist = rec_parse(v)
if ARGV[2] == '1' and f[F.w] ~= '1' and redis.call('PTTL', key) < 0 then
  f[F.w] = '1'
  redis.call('SET', key, rec_pack(f, hist))
end
return {f[F.s], f[F.p], f[F.a], f[F.m], f[F.c], f[F.d], f[F.u], f[F.b], f[F.e], f[F.r], hist}
