-- KEYS: the model's window list (send times µs, newest first), its cooldown. ARGV: window µs, share (calls
-- per window), spacing µs. Returns {status, wait µs}: "ok" (recorded as sent now) when fewer than `share`
-- calls were sent in the last window and none in the last `spacing`; else nothing recorded and "window"
-- with the µs until both hold, or "cooldown" with the µs left of a provider 429's cool-down (calls
-- reserved before it wait it out).
local cooldown = redis.call('PTTL', KEYS[2])
if cooldown > 0 then return {'cooldown', cooldown * 1000} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window, share, spacing = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local wait = 0
local oldest = tonumber(redis.call('LINDEX', KEYS[1], share - 1) or '')
if oldest then wait = oldest + window - now end
local newest = tonumber(redis.call('LINDEX', KEYS[1], 0) or '')
if newest and newest + spacing - now > wait then wait = newest + spacing - now end
if wait > 0 then return {'window', wait} end
redis.call('LPUSH', KEYS[1], string.format('%.0f', now))
redis.call('LTRIM', KEYS[1], 0, share - 1)
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000) + 1000)
return {'ok', 0}
