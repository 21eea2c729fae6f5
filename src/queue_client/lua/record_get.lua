-- ARGV: the head (RecordGetHead in args.rs): id, watch ('1': mark that an api instance waits for the task's end, unless it has
-- ended already). Returns nil when the task has no record, else the fields
-- {s, p, a, m, c, d, u, b, e, r, g, h} (see lib/views.lua).
local now = now_ms()
local A = head(ARGV, RECORD_GET_HEAD)
local id = A.id
-- A read writes nothing but the watch mark (see rec_visible), so a read-only user can
-- read; a record whose time is up is not shown, and left to the sweeps.
local read = {}
local v = rec_visible(id, now, read)
if not v then return nil end
local out, hist = rec_current(id, v, read)
if A.watch == '1' and not is_end_state(out[1]) then
  redis.call('SADD', K_WATCH, id)
end
out[#out + 1] = hist
return out
