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
if ARGV[2] == '1' then
  local _, _, seq = parse_meta(m)
  redis.call('ZREM', K_READY, member(seq, id))
  redis.call('ZREM', K_DELAYED, id)
  redis.call('ZREM', K_LEASED, id)
  redis.call('ZREM', K_DEAD, id)
  forget({id})
  redis.call('HINCRBY', K_STATS, 'cancelled', 1)
end
return out
