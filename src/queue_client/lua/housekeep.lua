-- ARGV: limit. Deletes up to `limit` records whose time is up; returns how many. The
-- manager calls it for every queue each tick, so records of a queue that sees no takes
-- still go on time.
return expire_records(now_ms(), tonumber(ARGV[1]))
