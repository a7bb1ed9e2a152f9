-- Removes a site and its edge's entry in the index (edge id -> site name), where the entry still names it.
-- KEYS[1]: the sites hash; KEYS[2]: the index hash. ARGV[1]: the site name. Returns 1, or 0 if no such site.
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return 0 end
local edge = string.format('%d', cjson.decode(held).edge_id)
if redis.call('HGET', KEYS[2], edge) == ARGV[1] then redis.call('HDEL', KEYS[2], edge) end
return redis.call('HDEL', KEYS[1], ARGV[1])
