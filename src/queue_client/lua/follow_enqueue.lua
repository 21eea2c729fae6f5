-- enqueue.lua after a check of the parents' leases, in one call: a slot's follow-ups on
-- one server, where the parents' queue and the children's share a script. KEYS: the
-- children's queue's, then the parents' queue's leases key; ARGV: enqueue.lua's, then the
-- parents' leases as token and id pairs, then how many pairs, last. Returns {'gone',
-- positions} (from 1) and writes nothing when a parent's lease is gone (it was cancelled
-- while it ran, or it expired and another slot took it: see held.lua); else what
-- enqueue.lua returns.
local n_leases = tonumber(ARGV[#ARGV])
local gone, whole, first = {}, {}, #ARGV - 2 * n_leases
for i = 0, n_leases - 1 do
  if not lease_stands(KEYS[#KEYS], ARGV[first + 2 * i], ARGV[first + 2 * i + 1], whole) then
    gone[#gone + 1] = i + 1
  end
end
if #gone > 0 then return {'gone', gone} end
return enqueue_part(ARGV, ARGN)
