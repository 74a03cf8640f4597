-- Enter the line: one atomic step, so no burst of concurrent enters can exceed the capacity,
-- share a number, or hold two places for one user.
--
-- KEYS[1] the line (sorted set, member = user, score = arrival number)
-- KEYS[2] the arrival counter
-- KEYS[3] this user's token
-- ARGV[1] user, ARGV[2] capacity
--
-- Returns {"READY", token, pttl_ms} | {"WAITING", position, 0 = new / 1 = already waiting} | {"FULL"}

local token = redis.call('GET', KEYS[3])
if token then
  return {'READY', token, redis.call('PTTL', KEYS[3])}
end

local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then
  return {'WAITING', rank + 1, 1}
end

if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return {'FULL'}
end

-- The score is Redis's own counter, never a server clock: arrival order at Redis is the order.
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], 'NX', seq, ARGV[1])
-- The newest number is the largest, so the new place is the last one.
return {'WAITING', redis.call('ZCARD', KEYS[1]), 0}
