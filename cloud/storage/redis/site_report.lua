-- Records a site's report, in one step: its name must be free or already this edge's, and the edge's former name
-- (the index: edge id -> site name) is dropped, so that each registration costs the same however many sites
-- exist. A registry written before the index gets the whole index first, from its records.
-- KEYS[1]: the sites hash (name -> SiteInfo JSON); KEYS[2]: the index hash (edge id -> site name).
-- ARGV[1]: the edge id; ARGV[2]: the site name; ARGV[3]: the site's SiteInfo JSON.
-- Returns the record that holds the name where another edge holds it (nothing is written), else nil.
if redis.call('EXISTS', KEYS[2]) == 0 then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    redis.call('HSET', KEYS[2], string.format('%d', cjson.decode(all[i + 1]).edge_id), all[i])
  end
end
local held = redis.call('HGET', KEYS[1], ARGV[2])
if held and cjson.decode(held).edge_id ~= tonumber(ARGV[1]) then return held end
local former = redis.call('HGET', KEYS[2], ARGV[1])
if former and former ~= ARGV[2] then redis.call('HDEL', KEYS[1], former) end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return false
