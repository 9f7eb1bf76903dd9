-- KEYS: day hash, month hash. ARGV: tokens, usd, day tokens limit, day usd limit, month tokens limit,
-- month usd limit (0 = none), day ttl, month ttl. Returns {"ok"} or {limit name, used, limit}.
local checks = {{1, 'tokens', 3, 'tokens_per_day'}, {1, 'usd', 4, 'usd_per_day'},
                {2, 'tokens', 5, 'tokens_per_month'}, {2, 'usd', 6, 'usd_per_month'}}
local add = {tokens = tonumber(ARGV[1]), usd = tonumber(ARGV[2])}
for _, c in ipairs(checks) do
  local limit = tonumber(ARGV[c[3]])
  if limit > 0 then
    local used = tonumber(redis.call('hget', KEYS[c[1]], c[2]) or '0')
    if used + add[c[2]] > limit then return {c[4], tostring(used), tostring(limit)} end
  end
end
for i = 1, 2 do
  redis.call('hincrby', KEYS[i], 'tokens', ARGV[1])
  redis.call('hincrbyfloat', KEYS[i], 'usd', ARGV[2])
  redis.call('expire', KEYS[i], ARGV[6 + i])
end
return {'ok'}
