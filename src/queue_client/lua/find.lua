-- ARGV: id, cancel ('1' removes the task). Returns nil when unknown, else
-- {state, score, meta, attempts, payload, error, lease token or ''}
local now = now_ms()
local id = ARGV[1]
local state, score, m = locate(id, now)
if not state then return nil end
local out = {
  state, score, m,
  attempts_of(redis.call('HGET', K_ATT, id)),
  redis.call('HGET', K_PAYLOAD, id) or '',
  redis.call('HGET', K_ERR, id) or '',
  token_of(redis.call('HGET', K_ATT, id)) or '',
}
if state == 'due' then out[1] = 'ready' end
if ARGV[2] == '1' then
  if state == 'ready' then
    -- O(length of the list): cancelling is rare, and a ready task must leave no entry
    -- behind that could hand it out after its id is enqueued again.
    local pri = parse_meta(m)
    local list = ready_list(pri)
    redis.call('LREM', list, 1, id)
    if redis.call('LLEN', list) == 0 then redis.call('ZREM', K_READY, pri) end
  end
  redis.call('ZREM', K_DELAYED, id)
  redis.call('ZREM', K_LEASED, id)
  redis.call('ZREM', K_DEAD, id)
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
end
return out
