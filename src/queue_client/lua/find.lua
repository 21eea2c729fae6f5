-- ARGV: id, cancel ('1' removes the task), note (the cancelled record's history note),
-- history_ttl_ms. Returns nil when unknown, else
-- {state, score, meta, attempts, payload, error, lease token or ''}; a leased task's
-- attempts count the one under way.
local now = now_ms()
local id = ARGV[1]
local state, score, m, member, tok = locate(id, now)
if not state then return nil end
local attempts = attempts_of(redis.call('HGET', K_ATT, id))
if state == 'leased' then attempts = attempts + 1 end
local out = {
  state == 'due' and 'ready' or state, score, m, attempts,
  redis.call('HGET', K_PAYLOAD, id) or '',
  redis.call('HGET', K_ERR, id) or '',
  tok or '',
}
if ARGV[2] == '1' then
  if state == 'ready' then
    -- O(length of the list): cancelling is rare, and a ready task must leave no entry
    -- behind that could hand it out after its id is enqueued again.
    local pri = parse_meta(m)
    local list = ready_list(pri)
    redis.call('LREM', list, 1, id)
    if redis.call('LLEN', list) == 0 then redis.call('ZREM', K_READY, pri) end
  elseif state == 'leased' then
    redis.call('ZREM', K_LEASED, member)
  else
    redis.call('ZREM', K_DELAYED, id)
    redis.call('ZREM', K_DEAD, id)
    redis.call('ZREM', K_FROZEN, id)
  end
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
  record(id, 'cancelled', now, nil, '', '', ARGV[3] or '', nil, history_ttl(ARGV[4]))
end
return out
