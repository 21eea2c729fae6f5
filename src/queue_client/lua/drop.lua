-- Deletes the whole queue, including its per-priority ready lists, its records and their
-- indexes, and the rosters of the chains its records are in (one whose records all expired
-- goes with its own time).
for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
  redis.call('DEL', ready_list(p))
end
redis.call('DEL', ready_dues.key())
local ids = redis.call('ZRANGE', K_IDX, 0, -1)
local read = {}
for _, id in ipairs(ids) do
  local v = rec_get(id, read)
  local g = v and chain_of(v) or ''
  if g ~= '' then redis.call('DEL', chain_roster(g)) end
  redis.call('DEL', rec_key(id))
end
for _, id in ipairs(redis.call('ZRANGE', K_EXP, 0, -1)) do redis.call('DEL', rec_key(id)) end
for _, member in ipairs(redis.call('ZRANGE', K_ENDS, 0, -1)) do
  -- (a run's records are all in K_IDX, deleted above; a list may hold others)
  if not run_of_end(member) then
    for _, id in ipairs(redis.call('LRANGE', ends_list(member), 0, -1)) do redis.call('DEL', rec_key(id)) end
    redis.call('DEL', ends_list(member))
  end
end
redis.call('DEL', K_ENDS)
for _, member in ipairs(redis.call('ZRANGE', K_LEASED, 0, -1)) do
  redis.call('DEL', run_key(lease_parts(member)))
end
blocks_drop()
for _, f in ipairs(redis.call('HKEYS', K_CONF)) do
  local by = string.match(f, '^by:(.*)$')
  if by then redis.call('DEL', submitter_index(by)) end
end
redis.call('DEL', K_CANCEL)
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
