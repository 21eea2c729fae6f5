-- The cluster's switch of a system and its generation, in one step (system.rs). KEYS: the
-- namespace's switches hash. ARGV: the head (SwitchHead in args.rs): system, state. Returns the state it was in ('' none
-- set) and the new generation.
local A = head(ARGV, SWITCH_HEAD)
local was = redis.call('HGET', KEYS[1], A.system)
local gen = redis.call('HINCRBY', KEYS[1], 'gen:' .. A.system, 1)
redis.call('HSET', KEYS[1], A.system, A.state)
return {was or '', gen}
