-- KEYS: the run's lease. ARGV: our token. Deletes the lease only if it is still ours; 1 if it did.
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0
