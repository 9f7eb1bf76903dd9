-- KEYS: running, minute, cpu day, line, seen, parked, woken
-- ARGV: now, ticket, slot ttl, concurrent, per minute, cpu per day, minute reset, day reset, arrival, stale
local now = tonumber(ARGV[1])
local ticket = ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ticket) then
  return {'in_progress', '1', '0'}
end
if tonumber(redis.call('GET', KEYS[3]) or '0') >= tonumber(ARGV[6]) then
  redis.call('ZREM', KEYS[4], ticket)
  redis.call('ZREM', KEYS[5], ticket)
  return {'cpu_seconds_per_day', ARGV[8], '0'}
end
local stale_before = now - tonumber(ARGV[10])
local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', stale_before)
for _, waiter in ipairs(gone) do
  if redis.call('HEXISTS', KEYS[6], waiter) == 0 and not redis.call('ZSCORE', KEYS[7], waiter) then
    redis.call('ZREM', KEYS[4], waiter)  -- polled no more, and neither parked nor just woken: gone
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', stale_before)
redis.call('ZADD', KEYS[4], 'NX', tonumber(ARGV[9]), ticket)
redis.call('ZADD', KEYS[5], now, ticket)
local line_ttl = math.ceil(tonumber(ARGV[10]) * 2) + 60
redis.call('EXPIRE', KEYS[4], line_ttl)
redis.call('EXPIRE', KEYS[5], line_ttl)
local rank = redis.call('ZRANK', KEYS[4], ticket)
local free = tonumber(ARGV[4]) - redis.call('ZCARD', KEYS[1])
if rank >= free then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local wait = first[2] and tostring(tonumber(first[2]) - now) or '1'
  return {'concurrent_executions', wait, tostring(rank)}
end
if rank >= tonumber(ARGV[5]) - tonumber(redis.call('GET', KEYS[2]) or '0') then
  return {'executions_per_minute', ARGV[7], tostring(rank)}
end
redis.call('ZREM', KEYS[4], ticket)
redis.call('ZREM', KEYS[5], ticket)
redis.call('ZREM', KEYS[7], ticket)
redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], 120)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ticket)
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])) + 60)
return {'ok', '0', '0'}
