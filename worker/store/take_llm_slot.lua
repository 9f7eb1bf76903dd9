-- KEYS: the model's slots (a sorted set: token -> when its hold lapses, ms on Redis's clock).
-- ARGV: token, cap, hold ms.
-- Take one of the model's `cap` slots for `hold` ms, after dropping holds that lapsed (their worker died
-- mid-call). Returns 1 if taken, else 0. A taken slot's hold is renewed with ARGV cap 0 (always granted
-- to a token that holds one).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if tonumber(ARGV[2]) == 0 then
  if redis.call('ZSCORE', KEYS[1], ARGV[1]) == false then return 0 end
elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + hold, ARGV[1])
redis.call('PEXPIRE', KEYS[1], hold)
return 1
