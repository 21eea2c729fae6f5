-- enqueue.lua after claim.lua, in one call: a slot's follow-ups and the chains they go in
-- (on one server, where a queue's keys and the chains' share the script). KEYS: the
-- queue's, then the chains' lists, then (when there are leases to check) the parents'
-- queue's leases key; ARGV: enqueue.lua's, then the lists' (claim.lua), then the lists'
-- ttl in ms, then the parents' leases as token and id pairs, then how many pairs, last.
-- Returns {-3, positions} (from 1) and writes nothing when a parent's lease is gone (it
-- was cancelled while it ran: see held.lua); {-2, refused} and enqueues nothing when a
-- claim is refused (the slot then takes the way that renames chains); else what
-- enqueue.lua returns.
-- (per task: mode 'p' a payload, 'ip' an id and a payload, 'ig' those and a chain; mode
-- 'ik' the ids, then two arguments for all)
local n_leases = tonumber(ARGV[#ARGV])
local last_list = #KEYS
if n_leases > 0 then
  local gone, whole, first = {}, {}, #ARGV - 2 * n_leases
  for i = 0, n_leases - 1 do
    if not lease_stands(KEYS[#KEYS], ARGV[first + 2 * i], ARGV[first + 2 * i + 1], whole) then
      gone[#gone + 1] = i + 1
    end
  end
  if #gone > 0 then return {-3, gone} end
  last_list = #KEYS - 1
end
-- (where the claims' arguments start: after the tasks', see enqueue.lua)
local n = tonumber(ARGV[1])
local tasks_end = 13 + ({p = n, ip = 2 * n, ig = 3 * n, ik = n + 2})[ARGV[6]]
local ttl = ARGV[#ARGV - 1 - 2 * n_leases]
local refused = claim_chains(19, tasks_end + 1, ttl, last_list)
if #refused > 0 then return {-2, refused} end
return enqueue_part()
