-- Where a user stands: waiting (and where), admitted (and the token), or neither.
-- A script rather than a pipeline so that an admission can never fall between the two reads.
--
-- KEYS[1] the line, KEYS[2] this user's token
-- ARGV[1] user
--
-- Returns {"WAITING", position} | {"READY", token, pttl_ms} | {"NOT_IN_QUEUE"}

local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then
  return {'WAITING', rank + 1}
end

local token = redis.call('GET', KEYS[2])
if token then
  return {'READY', token, redis.call('PTTL', KEYS[2])}
end

return {'NOT_IN_QUEUE'}
