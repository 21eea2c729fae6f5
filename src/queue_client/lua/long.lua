-- Long tasks (kind = "long"): what the slot holding one sends while it runs and when it
-- ends. scripts.rs puts settle.lua's body in `settle_part(ARGV, ARGN)` above this. ARGV[1] is
-- the op, then id and token of the lease:
--   'renew', id, token, lease_ms: extends the lease to lease_ms from now. Returns {1}
--     renewed, {2, note} renewed with a cancel asked (note: who asked), {0} no lease with
--     this token, or one past its expiry: it ran out and another slot may hold the task,
--     or the task ended.
--   'cancelled', id, token, attempt, host, slot, history_ttl_ms: the slot has stopped the
--     task after a cancel: it ends cancelled. Returns {1}, or {0} when the lease was gone.
--   'settle', id, token, attempt, host, slot, history_ttl_ms, then settle.lua's arguments
--     for this one task: the task returned. A cancel asked meanwhile wins (the task ends
--     cancelled, its outcome unused): returns {'c'}; else it is settled like any task:
--     returns {'s', settle's results}.
local op, id = ARGV[1], ARGV[2]
batches_split({ARGV[3]})
local member = ARGV[3] .. ':' .. id
local held = redis.call('ZSCORE', K_LEASED, member)
if op == 'renew' then
  -- A lease past its expiry is not brought back, reclaimed or not: its slot has stopped
  -- the task by its own clock, and a renewal that waited out a stall of Redis would keep
  -- the task from every other slot for one more lease.
  local now = now_ms()
  if not held or tonumber(held) <= now then return {0} end
  redis.call('ZADD', K_LEASED, 'XX', now + tonumber(ARGV[4]), member)
  local note = redis.call('HGET', K_CANCEL, id)
  if note then return {2, note} end
  return {1}
end
local cancelled = held and redis.call('HEXISTS', K_CANCEL, id) == 1
if cancelled then
  cancel_end(id, member, now_ms(), tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7]))
end
if op == 'cancelled' then return {cancelled and 1 or 0} end
if cancelled then return {'c'} end
local args = {}
for i = 8, #ARGV do args[#args + 1] = ARGV[i] end
return {'s', settle_part(args, #args)}
