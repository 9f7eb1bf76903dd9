-- KEYS: the model's window list (send times µs, newest first). ARGV: window µs, share (calls per window).
-- Records a send now and returns 0 when fewer than `share` calls were sent in the last window; else
-- records nothing and returns the µs until the oldest of them leaves the window.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window, share = tonumber(ARGV[1]), tonumber(ARGV[2])
local oldest = tonumber(redis.call('LINDEX', KEYS[1], share - 1) or '')
if oldest and oldest + window > now then return oldest + window - now end
redis.call('LPUSH', KEYS[1], string.format('%.0f', now))
redis.call('LTRIM', KEYS[1], 0, share - 1)
redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000) + 1000)
return 0
