-- A settle of one batch and the take of the next in one call: one round trip per batch in
-- a slot's steady state. scripts.rs puts settle.lua's body in `settle_part(ARGV)` and
-- take.lua's in `take_part(ARGV)` above this, each reading its own arguments as ARGV, so
-- both stay exactly the scripts that run alone.
-- ARGV: t, then take.lua's t arguments, then settle.lua's arguments.
-- Returns {settle's results, take's reply}. The settle runs first: a task it retries
-- without delay is ready again for this very take, and its acks are gone before the take
-- counts what is left.
local t = tonumber(ARGV[1])
local take_args, settle_args = {}, {}
for i = 1, t do take_args[i] = ARGV[1 + i] end
for i = t + 2, #ARGV do settle_args[#settle_args + 1] = ARGV[i] end
local settled = settle_part(settle_args)
return {settled, take_part(take_args)}
