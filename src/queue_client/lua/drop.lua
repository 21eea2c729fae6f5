-- Deletes the whole queue, including its per-priority ready lists.
for _, p in ipairs(redis.call('ZRANGE', K_READY, 0, -1)) do
  redis.call('DEL', ready_list(p))
end
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
