-- Extends a lease only for the token that holds it (compare-and-set of its TTL): 1, or 0 if it is lost.
-- KEYS[1]: the lease; ARGV[1]: the holder's token, ARGV[2]: the lease's length in milliseconds.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
