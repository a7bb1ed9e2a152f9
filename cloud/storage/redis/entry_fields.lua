-- One field of every entry of a stream, in stream order, each after its entry's id:
-- {id1, value1, id2, value2, ...}; an entry without the field is left out.
-- KEYS[1]: the stream; ARGV[1]: the field's name.
local out = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local fields = entry[2]
  for i = 1, #fields, 2 do
    if fields[i] == ARGV[1] then out[#out + 1] = entry[1]; out[#out + 1] = fields[i + 1] end
  end
end
return out
