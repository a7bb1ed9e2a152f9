-- Deletes a lease only for the token that holds it (compare-and-delete): 1, or 0 if it is lost.
-- KEYS[1]: the lease; ARGV[1]: the holder's token.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
