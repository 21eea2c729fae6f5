-- enqueue.lua after claim.lua, in one call: a slot's follow-ups and the chains they go in
-- (on one server, where a queue's keys and the chains' share the script). KEYS: the
-- queue's, then the chains' lists, then the lists of the chains that go unlisted, then
-- (when there are leases to check) the parents' queue's leases key; ARGV: enqueue.lua's,
-- then the lists' (claim.lua), then the lists' ttl in ms, then the parents' leases as
-- token and id pairs, then how many pairs, then how many unlisted chains, last.
-- Returns {-3, positions} (from 1) and writes nothing when a parent's lease is gone (it
-- was cancelled while it ran: see held.lua); {-6, positions} (from 1, among the unlisted
-- chains) and writes nothing when a chain asked to go unlisted has a list with a global
-- task (the slot then names its follow-ups as that list's chain); {-2, refused} and
-- enqueues nothing when a claim is refused (the slot then takes the way that renames
-- chains); else what enqueue.lua returns.
-- An unlisted chain (`crate::chain`, "route chains"): a global task's route follow-ups
-- named from its run, found by readers from its record, so nothing is written for it
-- here; a list of its own would say otherwise, a list of only added members (no '^') is
-- its follow-ups' below it and does not count.
-- (per task: mode 'p' a payload, 'ip' an id and a payload, 'ig' those and a chain; mode
-- 'ik' the ids, then two arguments for all)
local n_unlisted = tonumber(ARGV[#ARGV])
local n_leases = tonumber(ARGV[#ARGV - 1])
local last_key = #KEYS
if n_leases > 0 then
  local gone, whole, first = {}, {}, #ARGV - 1 - 2 * n_leases
  for i = 0, n_leases - 1 do
    if not lease_stands(KEYS[#KEYS], ARGV[first + 2 * i], ARGV[first + 2 * i + 1], whole) then
      gone[#gone + 1] = i + 1
    end
  end
  if #gone > 0 then return {-3, gone} end
  last_key = #KEYS - 1
end
local first_unlisted = last_key - n_unlisted + 1
if n_unlisted > 0 then
  -- (one EXISTS per thousand: most unlisted chains have no list at all)
  local listed, found = {}, 0
  for s = first_unlisted, last_key, 1000 do
    found = found + redis.call('EXISTS', unpack(KEYS, s, math.min(s + 999, last_key)))
  end
  if found > 0 then
    for k = first_unlisted, last_key do
      local v = redis.call('GET', KEYS[k])
      if v and string.sub(v, 1, 1) == '^' then listed[#listed + 1] = k - first_unlisted + 1 end
    end
    if #listed > 0 then return {-6, listed} end
  end
end
-- (where the claims' arguments start: after the tasks', see enqueue.lua)
local n = tonumber(ARGV[1])
local tasks_end = 13 + ({p = n, ip = 2 * n, ig = 3 * n, ik = n + 2})[ARGV[6]]
local ttl = ARGV[#ARGV - 2 - 2 * n_leases]
local refused = claim_chains(19, tasks_end + 1, ttl, first_unlisted - 1)
if #refused > 0 then return {-2, refused} end
return enqueue_part()
