-- A settle of one batch and the take of the next in one call: one round trip per batch in
-- a slot's steady state. scripts.rs puts settle.lua's body in `settle_part(ARGV, ARGN)`
-- and take.lua's in `take_part(ARGV, ARGN)` above this, each reading its own arguments as
-- ARGV, so both stay exactly the scripts that run alone.
-- ARGV: settle.lua's arguments, then take.lua's t arguments, then t. The settle's come
-- first so that it reads them where they are (a batch's ids are not copied).
-- Returns {settle's results, take's reply}. The settle runs first: a task it retries
-- without delay is ready again for this very take, and its acks are gone before the take
-- counts what is left.
local t = tonumber(ARGV[#ARGV])
local s = #ARGV - 1 - t
local take_args = {}
for i = 1, t do take_args[i] = ARGV[s + i] end
local settled = settle_part(ARGV, s)
return {settled, take_part(take_args, t)}
