-- KEYS: the tenant's streams zset. ARGV: now, lease end, limit, stream id. 1 = opened, 0 = at the cap.
redis.call('zremrangebyscore', KEYS[1], '-inf', ARGV[1])
if redis.call('zcard', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('zadd', KEYS[1], ARGV[2], ARGV[4])
redis.call('expire', KEYS[1], 3600)
return 1
