-- KEYS: the applied marker of this slot (hash: run id -> the last outbox entry applied here), the run's
-- end marker here (set once its last entry is applied), then the commands' keys. ARGV: run id, the entry's
-- sequence number, 1 if it is the run's last entry, the marker's TTL s, the end marker's TTL s, then the
-- commands (cas.script_commands). Applies the commands once per entry: returns their replies, or 0 if this
-- entry (or a later one) was applied here already.
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local seq = tonumber(ARGV[2])
if last >= seq then return 0 end
if ARGV[3] == '1' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], seq, 'EX', ARGV[5])
else
  redis.call('HSET', KEYS[1], ARGV[1], seq)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return run_commands(6)
