-- KEYS: tpm cell. ARGV: µs per token, token difference (actual - reserved). Never moves the TAT before now.
local current = redis.call('GET', KEYS[1])
if not current then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = math.max(tonumber(current) + tonumber(ARGV[1]) * tonumber(ARGV[2]), now)
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 60000)
return 1
