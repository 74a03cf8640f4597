-- Spend a token after the order succeeded: delete it only if it is still the one that was used,
-- so a newer token (the user entered again and was admitted again) is never removed.
--
-- KEYS[1] the user's token, KEYS[2] live tokens (see admit.lua)
-- ARGV[1] the token that was used, ARGV[2] the user
-- Returns 1 when deleted, 0 when the token had already changed or expired.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return redis.call('DEL', KEYS[1])
end
return 0
