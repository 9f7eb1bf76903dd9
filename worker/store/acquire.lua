-- KEYS: rpm cell, tpm cell, cooldown. ARGV: rpm interval µs (0: none), tpm interval µs per token (0: none),
-- tokens, rpm burst µs, tpm burst µs, max wait µs. Returns {status, wait µs}: status "ok" (reserved; start
-- after the wait), or the binding budget ("cooldown" | "rpm" | "tpm") with nothing reserved.
local cooldown = redis.call('PTTL', KEYS[3])
if cooldown > 0 then return {'cooldown', cooldown * 1000} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local max_wait = tonumber(ARGV[6])
local cells = {{KEYS[1], tonumber(ARGV[1]), 1, 'rpm', tonumber(ARGV[4])},
               {KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[3]), 'tpm', tonumber(ARGV[5])}}
local wait, binding = 0, 'ok'
for i, c in ipairs(cells) do
  if c[2] > 0 then
    local tat = math.max(tonumber(redis.call('GET', c[1]) or '0'), now)
    c[6] = tat
    local w = tat - now - c[5]
    if w > wait then wait, binding = w, c[4] end
  end
end
if wait > max_wait then return {binding, wait} end
for i, c in ipairs(cells) do
  if c[2] > 0 then
    local tat = c[6] + c[3] * c[2]
    redis.call('SET', c[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 60000)
  end
end
return {'ok', wait}
