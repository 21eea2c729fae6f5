-- The ceiling for take: pop n ids, lease them in a sorted set, fetch their payloads.
-- Returns {ids, payloads}: Redis makes the nested arrays from the tables it has, so no
-- loop over the tasks builds the reply.
local ids = redis.call('LPOP', KEYS[1], ARGV[1])
if not ids then return {{}, {}} end
local t = redis.call('TIME')
local exp = tonumber(t[1]) * 1000 + tonumber(ARGV[2])
-- The score as text once: a number handed to redis.call is printed and parsed per member.
local exp_s = string.format('%d', exp)
local z = {}
for i, id in ipairs(ids) do
  z[2 * i - 1] = exp_s
  z[2 * i] = id
end
redis.call('ZADD', KEYS[2], unpack(z))
return {ids, redis.call('HMGET', KEYS[3], unpack(ids))}
