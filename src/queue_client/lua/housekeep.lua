-- ARGV: the head (HousekeepHead in args.rs): limit. Deletes up to `limit` records whose time is up; returns how many. The
-- manager calls it for every queue each tick, so records of a queue that sees no takes
-- still go on time.
local A = head(ARGV, HOUSEKEEP_HEAD)
return expire_records(now_ms(), tonumber(A.limit))
