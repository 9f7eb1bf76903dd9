-- KEYS: the events stream, the compacted string, then any keys to delete first.
if #KEYS > 2 then redis.call('DEL', unpack(KEYS, 3)) end
return compact(KEYS[1], KEYS[2])
