-- KEYS: per quota, the tenant's in-flight set and this minute's submissions counter. ARGV: the number
-- of quotas, then per quota its runs, in-flight limit and per-minute limit, then the commands
-- (cas.script_commands). Returns {-2 or -1, i} when quota i is over its in-flight or per-minute
-- limit (nothing written), else {0, each command's reply}.
local n = tonumber(ARGV[1])
for q = 1, n do
  local adding = tonumber(ARGV[3 * q - 1])
  if redis.call('SCARD', KEYS[2 * q - 1]) + adding > tonumber(ARGV[3 * q]) then return {-2, q} end
  if tonumber(redis.call('GET', KEYS[2 * q]) or '0') + adding > tonumber(ARGV[3 * q + 1]) then return {-1, q} end
end
for q = 1, n do  -- a minute's counter is read in its minute only: an expiry from when it was made will do
  if redis.call('INCRBY', KEYS[2 * q], ARGV[3 * q - 1]) == tonumber(ARGV[3 * q - 1]) then
    redis.call('EXPIRE', KEYS[2 * q], 120)
  end
end
return {0, run_commands(3 * n + 2)}
