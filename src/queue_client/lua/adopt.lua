-- A queue's copy of a switch adopted by the cluster (system.rs), where the cluster's count
-- is behind it: the cluster lost that switch (its hash's node failed over, or the hash was
-- lost) while the queues kept it. KEYS: the namespace's switches hash. ARGV: system, the
-- copy's state, its generation. Returns 1 when adopted, 0 when the count is not behind (a
-- later switch holds).
local f = 'gen:' .. ARGV[1]
local theirs = tonumber(ARGV[3])
local count = tonumber(redis.call('HGET', KEYS[1], f)) or 0
if count >= theirs then return 0 end
redis.call('HSET', KEYS[1], f, theirs, ARGV[1], ARGV[2])
return 1
