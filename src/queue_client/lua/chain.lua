-- Sets the record's chain of tasks whose records name none yet: tasks in no chain that
-- became the global task of one by adding follow-ups (its id is named from the task's
-- record number, see chain_name). ARGV: pairs (id, chain). Returns how many it set.
-- The record with its (empty) chain field set to `g`.
local function with_chain(v, g)
  local cut = string.find(v, RS, 1, true)
  return string.sub(v, 1, cut - 1) .. g .. string.sub(v, cut)
end
local n = 0
for i = 1, #ARGV, 2 do
  local id, g = ARGV[i], ARGV[i + 1]
  local v = rec_get(id, {})
  if v and string.match(v, G_PAT) == '' then
    -- the empty chain field ends the head: the chain goes just before the history
    redis.call('SET', rec_key(id), with_chain(v, g))
    n = n + 1
  end
end
return n
