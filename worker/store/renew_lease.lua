-- KEYS: the run's lease. ARGV: our token, TTL in ms. Extends the lease only if it is still ours.
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0
