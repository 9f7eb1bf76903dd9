-- KEYS: run record, lease, its events stream and compacted events, then the commands' keys. ARGV: expected
-- bytes, new bytes, lease token ("" = keep the lease), 1 to compact the events after the commands (a write
-- that finishes the run), then the commands (script_commands). Returns 0 if the record was not the expected
-- bytes, else each command's reply.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local replies = run_commands(5)
if ARGV[4] == '1' then compact(KEYS[3], KEYS[4]) end
return replies
