-- ARGV: ids. Returns four entries per id: a kind ('r' the task has a record, 't' the
-- queue holds the task but keeps no record of it, '' neither), a state, a record's
-- chain field ('' none, or no record) and its submitter ('' none, or no record). A record's
-- state is its current one, as record_get.lua shows it; a task without one is 'running'
-- (leased, or 'cancelling' once its cancel was asked), 'failed' (a dead letter), 'frozen'
-- or 'waiting'. Writes nothing: what a bulk's dedup hits answer, and what a chain's start
-- checks, read for many ids in one call rather than one call each.
local now = now_ms()
local read = {}
local out = {}
for _, id in ipairs(ARGV) do
  local v = rec_visible(id, now, read)
  if v then
    local r = rec_current(id, v, read)
    out[#out + 1] = 'r'
    out[#out + 1] = r[1]
    out[#out + 1] = r[11] or ''
    out[#out + 1] = r[8] or ''
  else
    local where = locate(id, now, false, false)
    local st = 'waiting'
    if where == 'leased' then
      st = redis.call('HEXISTS', K_CANCEL, id) == 1 and 'cancelling' or 'running'
    elseif where == 'dead' then
      st = 'failed'
    elseif where == 'frozen' then
      st = 'frozen'
    end
    out[#out + 1] = where and 't' or ''
    out[#out + 1] = st
    out[#out + 1] = ''
    out[#out + 1] = ''
  end
end
return out
