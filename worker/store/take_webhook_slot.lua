-- KEYS: the tenant's webhook attempts in flight, the destination host's (sorted sets: token -> when its
-- hold lapses, ms on Redis's clock). ARGV: token, tenant cap, host cap, hold ms.
-- Take a slot of both at once, after dropping holds that lapsed (their worker died mid-attempt). Returns
-- '' if taken, else the cap that is full ('tenant' | 'host') with nothing taken.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local hold = tonumber(ARGV[4])
local caps = {{KEYS[1], tonumber(ARGV[2]), 'tenant'}, {KEYS[2], tonumber(ARGV[3]), 'host'}}
for _, c in ipairs(caps) do
  redis.call('ZREMRANGEBYSCORE', c[1], '-inf', now)
  if redis.call('ZCARD', c[1]) >= c[2] then return c[3] end
end
for _, c in ipairs(caps) do
  redis.call('ZADD', c[1], now + hold, ARGV[1])
  redis.call('PEXPIRE', c[1], hold)
end
return ''
