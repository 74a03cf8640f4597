-- Settle a claimed token once the upstream answered: spend it after a successful order, and end
-- the request's claim either way. The token is deleted only if it is still the one that was used,
-- so a newer token (the user entered again and was admitted again) is never removed, and the
-- claim only if it is still this request's.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  user_token (the user's token), user_claim (the claim on it), tokens (live tokens, see
--       admit.lua)
-- ARGV  token (the one that was used), user, claim (the request's claim id), spend (1: the
--       order succeeded), spent_channel (where spent tokens are announced: a channel, not a key)
-- Returns 1 when the token was deleted, else 0.
--
-- A spent token is announced on spent_channel as '<ms it had left> <token> <user>' before it
-- is deleted: every proxy subscribed then remembers it, refuses it even if Redis loses this write
-- (a restart from an older snapshot, a failover to a replica that lagged), and runs this script
-- again once it notices such a loss (with no claim), so Redis forgets the token once more.

if redis.call('GET', user_claim) == claim then
  redis.call('DEL', user_claim)
end
if spend and redis.call('GET', user_token) == token then
  redis.call('PUBLISH', spent_channel, redis.call('PTTL', user_token) .. ' ' .. token .. ' ' .. user)
  redis.call('ZREM', tokens, user)
  return redis.call('DEL', user_token)
end
return 0
