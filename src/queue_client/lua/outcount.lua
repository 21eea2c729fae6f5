-- A switch's count raised past a queue's copy (system.rs). KEYS: the namespace's switches
-- hash. ARGV: system, state, the copy's generation, the switch's own. Returns -1 when the
-- count is not behind the copy, or has moved past the switch's own (a later switch holds,
-- and outcounts the copy itself when refused), else the new generation, the switch
-- written with it.
local f = 'gen:' .. ARGV[1]
local theirs = tonumber(ARGV[3])
local count = tonumber(redis.call('HGET', KEYS[1], f)) or 0
if count >= theirs or count > tonumber(ARGV[4]) then return -1 end
redis.call('HSET', KEYS[1], f, theirs + 1, ARGV[1], ARGV[2])
return theirs + 1
