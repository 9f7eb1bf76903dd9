-- KEYS: run record, lease, and (a write that finishes the run) its events stream and compacted events,
-- compacted after the commands. ARGV: expected bytes, new bytes, lease token ("" = keep the lease), then
-- the commands (script_commands). Returns 0 if the record was not the expected bytes, else each
-- command's reply.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
if ARGV[3] ~= '' and redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local replies = run_commands(4)
if #KEYS == 4 then compact(KEYS[3], KEYS[4]) end
return replies
