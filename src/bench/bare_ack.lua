-- The ceiling for ack: drop the leases and the payloads.
redis.call('ZREM', KEYS[1], unpack(ARGV))
redis.call('HDEL', KEYS[2], unpack(ARGV))
return #ARGV
