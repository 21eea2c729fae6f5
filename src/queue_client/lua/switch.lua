-- The cluster's switch of a system and its generation, in one step (system.rs). KEYS: the
-- namespace's switches hash. ARGV: system, state. Returns the state it was in ('' none
-- set) and the new generation.
local was = redis.call('HGET', KEYS[1], ARGV[1])
local gen = redis.call('HINCRBY', KEYS[1], 'gen:' .. ARGV[1], 1)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {was or '', gen}
