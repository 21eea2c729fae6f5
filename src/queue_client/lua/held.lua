-- Which leases still stand, writing nothing: before a slot makes the follow-ups of a
-- batch its handler finished, so that a task cancelled while it ran (its lease removed)
-- starts no children (on one server the check is part of follow_enqueue.lua instead).
-- ARGV: token and id of each lease, in pairs. Returns per pair 1 while the lease stands
-- (lease_stands), else 0.
local out, whole = {}, {}
for i = 1, #ARGV, 2 do
  out[#out + 1] = lease_stands(K_LEASED, ARGV[i], ARGV[i + 1], whole) and 1 or 0
end
return out
