-- Chains' member lists (`crate::chain`): claims of new chains and members added to
-- chains, written before the follow-ups they list are enqueued. KEYS from `k` on are the
-- lists (up to KEYS[last], or the last key); per list two arguments from ARGV[a] on: its
-- head as a claim would write it (`^`,
-- the global task, and `@RUN@` unless a submit's claim; '' for a list only added to),
-- and the members (follow-ups with their parents). Returns {position, holder} for each
-- claim refused, positions from 1 (a reply per list was most of what a batch's claims
-- cost the slot).
-- A claim: only the chain's own global task sets the list's lifetime or adds to it, so a
-- refused claim changes nothing. A list without a global task (its follow-ups were added
-- after it expired) gets one at its head. A run's claim writes the run after the global
-- task; a submit's writes none, and the first run's claim writes its own. Another run's
-- list is refused with the holder '', and a list a gaffer that did not tell runs apart
-- gave members becomes the first run's that claims it, marked `@=RUN@`, its members as
-- they were and none added, answered '=' (its children keep their old ids) to that run
-- and refused to any other. The head's parts are taken apart only when the chain exists
-- already, which is rare.
-- SET, GET, APPEND and PEXPIRE only: the commands the ACL lines of the slots and the api
-- grant on chain keys (docs/SECURITY.md).
local function claim_chains(k, a, ttl, last)
  local out, i = {}, 0
  while k <= (last or #KEYS) do
    i = i + 1
    local key, mine, mem = KEYS[k], ARGV[a], ARGV[a + 1]
    local holder = true
    if mine == '' then
      redis.call('APPEND', key, mem)
      redis.call('PEXPIRE', key, ttl)
    elseif not redis.call('SET', key, mine .. mem, 'NX', 'PX', ttl) then
      local n = string.match(mine, '^%^(%d+):') or '0'
      local cut = #n + 2 + tonumber(n)
      local head = string.sub(mine, 1, cut)
      local run = string.match(string.sub(mine, cut + 1), '^@([^@]*)@')
      local v = redis.call('GET', key) or ''
      if string.sub(v, 1, cut) == head then
        local rest = string.sub(v, cut + 1)
        local theirs = string.match(rest, '^@([^@]*)@')
        if run == nil or theirs == run then
          if #mem > 0 then redis.call('APPEND', key, mem) end
          redis.call('PEXPIRE', key, ttl)
        elseif theirs == nil and rest == '' then
          redis.call('SET', key, mine .. mem, 'PX', ttl)
        elseif theirs == nil then
          redis.call('SET', key, head .. '@=' .. run .. '@' .. rest, 'PX', ttl)
          holder = '='
        elseif theirs == '=' .. run then
          redis.call('PEXPIRE', key, ttl)
          holder = '='
        else
          holder = ''
        end
      elseif string.sub(v, 1, 1) ~= '^' then
        redis.call('SET', key, mine .. v .. mem, 'PX', ttl)
      else
        local m = string.match(v, '^%^(%d+):') or '0'
        holder = string.sub(v, 2, #m + 2 + tonumber(m))
      end
    end
    if holder ~= true then out[#out + 1] = i; out[#out + 1] = holder end
    k, a = k + 1, a + 2
  end
  return out
end
