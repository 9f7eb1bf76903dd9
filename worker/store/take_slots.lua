-- KEYS: one sorted set of slots per cap (token -> when its hold lapses, ms on Redis's clock): a model's
-- requests in flight (worker/store/llm_slots.py), or a tenant's and a host's webhook attempts
-- (worker/store/webhook_slots.py). ARGV: token, hold ms, then each key's cap.
-- Take a slot in every set at once, after dropping holds that lapsed (their worker died mid-call). Returns 0
-- if taken, else the (1-based) index of the first set that is full, with nothing taken. A cap of 0 renews
-- a hold: granted only to a token that holds a slot there.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local cap = tonumber(ARGV[i + 2])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  if cap == 0 then
    if redis.call('ZSCORE', key, ARGV[1]) == false then return i end
  elseif redis.call('ZCARD', key) >= cap then
    return i
  end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + hold, ARGV[1])
  redis.call('PEXPIRE', key, hold)
end
return 0
