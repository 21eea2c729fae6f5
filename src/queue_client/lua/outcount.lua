-- A switch's count raised past a queue's copy (system.rs). KEYS: the namespace's switches
-- hash. ARGV: the head (OutcountHead in args.rs): system, state, the copy's generation
-- (theirs), the switch's own (ours). Returns {'kept'} when
-- the count is not behind the copy, or has moved past the switch's own (a later switch
-- holds, and outcounts the copy itself when refused), else {'raised', the new generation},
-- the switch written with it.
local A = head(ARGV, OUTCOUNT_HEAD)
local f = 'gen:' .. A.system
local theirs = tonumber(A.theirs)
local count = tonumber(redis.call('HGET', KEYS[1], f)) or 0
if count >= theirs or count > tonumber(A.ours) then return {'kept'} end
redis.call('HSET', KEYS[1], f, theirs + 1, A.system, A.state)
return {'raised', theirs + 1}
