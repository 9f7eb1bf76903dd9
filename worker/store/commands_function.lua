-- Runs the commands that script_commands() encoded into ARGV from index `first` on; their replies. Each
-- command is its length (name and arguments), how many of its first arguments are keys, its name, the
-- keys as indexes into KEYS (so the script names every key it touches: a Redis Cluster needs that), then
-- its other arguments.
local function run_commands(first)
  local replies = {}
  local i = first
  while i <= #ARGV do
    local n, nkeys = tonumber(ARGV[i]), tonumber(ARGV[i + 1])
    local call = {ARGV[i + 2]}
    for j = i + 3, i + 2 + nkeys do call[#call + 1] = KEYS[tonumber(ARGV[j])] end
    for j = i + 3 + nkeys, i + 1 + n do call[#call + 1] = ARGV[j] end
    replies[#replies + 1] = redis.call(unpack(call))
    i = i + n + 2
  end
  return replies
end
