-- KEYS: failures, circuit. ARGV: base ms, cap ms, failures' TTL ms.
-- A call failed. While the circuit is open this changes nothing (calls that were already in flight when it
-- opened fail too: they are not news). Otherwise one more round failed: open the circuit for
-- base * 2^(rounds - 1) ms, at most cap. Returns the rounds failed in a row and the ms the circuit is open for.
local left = redis.call('PTTL', KEYS[2])
if left > 0 then
  return {tonumber(redis.call('GET', KEYS[1]) or '1'), left}
end
local rounds = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local open_ms = math.floor(math.min(tonumber(ARGV[2]), tonumber(ARGV[1]) * 2 ^ math.min(rounds - 1, 32)))
redis.call('SET', KEYS[2], rounds, 'PX', open_ms)
return {rounds, open_ms}
