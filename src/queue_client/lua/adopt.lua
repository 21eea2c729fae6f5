-- A queue's copy of a switch adopted by the cluster (system.rs), where the cluster's count
-- is behind it: the cluster lost that switch (its hash's node failed over, or the hash was
-- lost) while the queues kept it. KEYS: the namespace's switches hash. ARGV: the head
-- (AdoptHead in args.rs): system, the copy's state, its generation (theirs). Returns 1 when adopted, 0 when the count is not behind (a
-- later switch holds).
local A = head(ARGV, ADOPT_HEAD)
local f = 'gen:' .. A.system
local theirs = tonumber(A.theirs)
local count = tonumber(redis.call('HGET', KEYS[1], f)) or 0
if count >= theirs then return 0 end
redis.call('HSET', KEYS[1], f, theirs, A.system, A.state)
return 1
