-- A call as its step sends it: 'send' when its place in line is within the capacity free now (it then counts
-- as woken until it arrives, so the calls behind it are not woken into its slot), else 'parked' beside the
-- line, as a waiting call's delivery parks it. A call that holds a slot already (a duplicate) is sent. A new
-- ticket goes behind every ticket in line, whatever its arrival says: steps on other threads and machines
-- stamp their calls before they enter, and a call sent ahead of an earlier-stamped one must keep its place.
-- KEYS: running, minute, line, parked, parked deadlines, woken, parked lines, seen
-- ARGV: now, ticket, concurrent, per minute, arrival, request, deadline, woken ttl, line name, stale, keep
local now = tonumber(ARGV[1])
local ticket = ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ticket) then
  return 'send'
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[8]))
if not redis.call('ZSCORE', KEYS[3], ticket) then
  local arrival = tonumber(ARGV[5])
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if last[2] and tonumber(last[2]) >= arrival then
    arrival = tonumber(last[2]) + 0.00001
  end
  redis.call('ZADD', KEYS[3], arrival, ticket)
end
redis.call('ZADD', KEYS[8], now, ticket)
local line_ttl = math.ceil(tonumber(ARGV[10]) * 2) + 60
redis.call('EXPIRE', KEYS[3], line_ttl)
redis.call('EXPIRE', KEYS[8], line_ttl)
local rank = redis.call('ZRANK', KEYS[3], ticket)
local free = math.min(tonumber(ARGV[3]) - redis.call('ZCARD', KEYS[1]),
                      tonumber(ARGV[4]) - tonumber(redis.call('GET', KEYS[2]) or '0'))
if rank < free then
  redis.call('ZADD', KEYS[6], now, ticket)
  return 'send'
end
redis.call('HSET', KEYS[4], ticket, ARGV[6])
redis.call('ZADD', KEYS[5], tonumber(ARGV[7]), ticket)
redis.call('ZREM', KEYS[6], ticket)
redis.call('SADD', KEYS[7], ARGV[9])
redis.call('EXPIRE', KEYS[4], tonumber(ARGV[11]))
redis.call('EXPIRE', KEYS[5], tonumber(ARGV[11]))
return 'parked'
