-- Where a queue's layout stands, for `gaffer migrate` (migrate.rs), on a queue of any
-- layout. Returns {layout field ('' none), migration position ('' none), 1 when the queue
-- holds data, else 0}.
local at = redis.call('HMGET', K_CONF, LAYOUT_FIELD, MIGRATE_FIELD)
return {at[1] or '', at[2] or '', holds_data() and 1 or 0}
