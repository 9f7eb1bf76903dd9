-- Runs the commands that script_commands() encoded into ARGV from index `first` on; their replies.
local function run_commands(first)
  local replies = {}
  local i = first
  while i <= #ARGV do
    local n = tonumber(ARGV[i])
    replies[#replies + 1] = redis.call(unpack(ARGV, i + 1, i + n))
    i = i + n + 1
  end
  return replies
end
