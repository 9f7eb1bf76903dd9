-- A finished run's event stream compacted into one small JSON string (same entry ids, same TTL) whose
-- `step` events point at the step list instead of repeating each step's text (a stream costs ~4 KB
-- however few its entries). The stream itself expires STREAM_LINGER_MS later instead of going at once:
-- a subscriber blocked reading it is served only if the stream still exists when the script ends, and
-- one that read no compacted string a moment ago reads the stream next.
local function compact(stream, compacted)
  local ttl = redis.call('PTTL', stream)
  local entries = redis.call('XRANGE', stream, '-', '+')
  if #entries == 0 then return 0 end
  local out = {}
  for _, entry in ipairs(entries) do
    local fields, kind, data = entry[2], nil, nil
    for i = 1, #fields, 2 do
      if fields[i] == 'type' then kind = fields[i + 1] elseif fields[i] == 'data' then data = fields[i + 1] end
    end
    if kind == 'step' and data then
      -- a step event holds its index (older ones the whole step, its index first: read that, not the rest)
      local index = tonumber(data) or tonumber(string.match(data, '^{"index":(%d+)[,}]'))
      table.insert(out, {entry[1], kind, index or cjson.decode(data)['index']})
    else
      table.insert(out, {entry[1], kind, data or '{}'})
    end
  end
  redis.call('SET', compacted, cjson.encode(out))
  if ttl > 0 then redis.call('PEXPIRE', compacted, ttl) end
  redis.call('PEXPIRE', stream, {{STREAM_LINGER_MS}})
  return #entries
end
