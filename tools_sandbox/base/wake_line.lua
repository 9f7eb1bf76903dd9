-- KEYS: running, minute, line, parked, parked deadlines, woken, parked lines
-- ARGV: now, concurrent, per minute, woken ttl, line name (for parked lines), scan limit
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[4]))
local free = math.min(tonumber(ARGV[2]) - redis.call('ZCARD', KEYS[1]),
                      tonumber(ARGV[3]) - tonumber(redis.call('GET', KEYS[2]) or '0'))
free = free - redis.call('ZCARD', KEYS[6])
local out = {}
local function take(ticket)
  local request = redis.call('HGET', KEYS[4], ticket)
  if request then
    redis.call('HDEL', KEYS[4], ticket)
    redis.call('ZREM', KEYS[5], ticket)
    redis.call('ZADD', KEYS[6], now, ticket)
    out[#out + 1] = request
    return true
  end
  return false
end
for _, ticket in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
  take(ticket)
end
if free > 0 then
  for _, ticket in ipairs(redis.call('ZRANGE', KEYS[3], 0, free + tonumber(ARGV[6]) - 1)) do
    if free <= 0 then break end
    if take(ticket) then free = free - 1 end
  end
end
if redis.call('HLEN', KEYS[4]) == 0 then
  redis.call('SREM', KEYS[7], ARGV[5])
end
return out
