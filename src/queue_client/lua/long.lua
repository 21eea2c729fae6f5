-- Long tasks (kind = "long"): what the slot holding one sends while it runs and when it
-- ends. scripts.rs puts settle.lua's body in `settle_part(ARGV, ARGN)` above this. ARGV: the
-- head (LongHead in args.rs, read by name as A.op, …): op, id, token, lease_ms, attempt,
-- host, slot, history_ttl_ms; every op sends all of it. By op:
--   'renew': extends the lease to lease_ms from now. Returns {'renewed'}, {'cancel_asked',
--     note} (renewed, and a cancel was asked: note says who asked), or {'lost'}: no lease
--     with this token, or one past its expiry (it ran out and another slot may hold the
--     task, or the task ended).
--   'cancelled': the slot has stopped the task after a cancel: it ends cancelled. Returns
--     {'ended'}, or {'lost'} when the lease was gone.
--   'settle', then settle.lua's arguments for this one task: the task returned. A cancel
--     asked meanwhile wins (the task ends cancelled, its outcome unused): returns
--     {'cancelled'}; else it is settled like any task: returns {'settled', settle's
--     results}.
local H = #LONG_HEAD
local A = head(ARGV, LONG_HEAD)
local op, id = A.op, A.id
batches_split({A.token})
local member = A.token .. ':' .. id
local held = redis.call('ZSCORE', K_LEASED, member)
if op == 'renew' then
  -- A lease past its expiry is not brought back, reclaimed or not: its slot has stopped
  -- the task by its own clock, and a renewal that waited out a stall of Redis would keep
  -- the task from every other slot for one more lease.
  local now = now_ms()
  if not held or tonumber(held) <= now then return {'lost'} end
  redis.call('ZADD', K_LEASED, 'XX', now + tonumber(A.lease_ms), member)
  local note = redis.call('HGET', K_CANCEL, id)
  if note then return {'cancel_asked', note} end
  return {'renewed'}
end
local cancelled = held and redis.call('HEXISTS', K_CANCEL, id) == 1
if cancelled then
  cancel_end(id, member, now_ms(), tonumber(A.attempt), A.host, A.slot, tonumber(A.history_ttl_ms))
end
if op == 'cancelled' then return {cancelled and 'ended' or 'lost'} end
if cancelled then return {'cancelled'} end
local args = {}
for i = H + 1, #ARGV do args[#args + 1] = ARGV[i] end
return {'settled', settle_part(args, #args)}
