-- enqueue.lua after claim.lua, in one call: a slot's follow-ups and the chains they go in
-- (on one server, where a queue's keys and the chains' share the script). KEYS: the
-- queue's, then the chains' lists; ARGV: enqueue.lua's, then the lists' (claim.lua),
-- then the lists' ttl in ms as the last. Returns {-2, refused} and enqueues nothing when
-- a claim is refused (the slot then takes the way that renames chains); else what
-- enqueue.lua returns.
-- (per task: mode 'p' a payload, 'ip' an id and a payload, 'ig' those and a chain)
local per = ({p = 1, ip = 2, ig = 3})[ARGV[6]]
local refused = claim_chains(19, 14 + per * tonumber(ARGV[1]), ARGV[#ARGV])
if #refused > 0 then return {-2, refused} end
return enqueue_part()
