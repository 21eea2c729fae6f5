-- One call of a migration pass (migrate.rs), the pass's body being `pass(cursor, budget)`
-- before this. ARGV: the position the caller read (K_CONF's MIGRATE_FIELD, '' none), the
-- layout it read ('' none), this pass, its cursor ('0' to begin), the step's next pass
-- ('' when this is its last), the layout the step reaches, budget.
-- The position moves in the same call as the work, so a migrate stopped anywhere goes
-- on from there. Returns {1, n} when the pass has more, {2, n} when it is done (the
-- position names the next pass, or the step's layout is stamped), {0, 0} when another
-- migrate moved the position meanwhile (read it again); n is what the call looked at.
local at = redis.call('HMGET', K_CONF, MIGRATE_FIELD, LAYOUT_FIELD)
if (at[1] or '') ~= ARGV[1] or (at[2] or '') ~= ARGV[2] then return {0, 0} end
local next_cursor, n = pass(ARGV[4], tonumber(ARGV[7]))
if next_cursor then
  redis.call('HSET', K_CONF, MIGRATE_FIELD, ARGV[3] .. ' ' .. next_cursor)
  return {1, n}
end
if ARGV[5] ~= '' then
  redis.call('HSET', K_CONF, MIGRATE_FIELD, ARGV[5] .. ' 0')
else
  redis.call('HDEL', K_CONF, MIGRATE_FIELD)
  redis.call('HSET', K_CONF, LAYOUT_FIELD, ARGV[6])
end
return {2, n}
