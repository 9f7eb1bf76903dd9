-- Keep a call's pending marker alive for at least ARGV[1] ms more: set it when it has less left, never shorten it.
-- KEYS: the marker
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], '1', 'PX', ms)
end
