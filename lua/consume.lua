-- Spend a token after the order succeeded: delete it only if it is still the one that was used,
-- so a newer token (the user entered again and was admitted again) is never removed.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  user_token (the user's token), tokens (live tokens, see admit.lua)
-- ARGV  token (the one that was used), user
-- Returns 1 when deleted, 0 when the token had already changed or expired.

if redis.call('GET', user_token) == token then
  redis.call('ZREM', tokens, user)
  return redis.call('DEL', user_token)
end
return 0
