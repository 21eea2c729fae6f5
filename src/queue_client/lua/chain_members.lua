-- The ids of the tasks of a chain this queue holds, writing nothing. ARGV: the head
-- (ChainMembersHead in args.rs): the chain's id.
-- Returns them in the order they were listed (their roster's entries "CHAIN FS ID RS": see
-- lib/chains.lua), none when the queue holds none or their list expired.
local A = head(ARGV, CHAIN_MEMBERS_HEAD)
local chain = A.chain
local v = redis.call('GET', chain_roster(chain))
if not v then return {} end
local out, probe, at = {}, RS .. chain .. FS, 0
v = RS .. v
while true do
  local from = string.find(v, probe, at + 1, true)
  if not from then return out end
  local stop = string.find(v, RS, from + #probe, true)
  out[#out + 1] = string.sub(v, from + #probe, stop - 1)
  at = stop - 1
end
