-- One call of a migration pass (migrate.rs), the pass's body being `pass(cursor, budget)`
-- before this. ARGV: the head (MigrateHead in args.rs, read by name as A.position, …): the
-- position the caller read (K_CONF's MIGRATE_FIELD, '' none), the layout it read ('' none),
-- this pass, its cursor ('0' to begin), the step's next pass ('' when this is its last),
-- the layout the step reaches, budget.
-- The position moves in the same call as the work, so a migrate stopped anywhere goes
-- on from there. Returns {'more', n} when the pass has more, {'done', n} when it is done
-- (the position names the next pass, or the step's layout is stamped), {'raced', 0} when
-- another migrate moved the position meanwhile (read it again); n is what the call looked
-- at.
local A = head(ARGV, MIGRATE_HEAD)
local at = redis.call('HMGET', K_CONF, MIGRATE_FIELD, LAYOUT_FIELD)
if (at[1] or '') ~= A.position or (at[2] or '') ~= A.layout then return {'raced', 0} end
local next_cursor, n = pass(A.cursor, tonumber(A.budget))
if next_cursor then
  redis.call('HSET', K_CONF, MIGRATE_FIELD, A.pass .. ' ' .. next_cursor)
  return {'more', n}
end
if A.next ~= '' then
  redis.call('HSET', K_CONF, MIGRATE_FIELD, A.next .. ' 0')
else
  redis.call('HDEL', K_CONF, MIGRATE_FIELD)
  redis.call('HSET', K_CONF, LAYOUT_FIELD, A.to)
end
return {'done', n}
