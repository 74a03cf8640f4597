-- Settle claimed tokens once the upstream answered: spend each after a successful order, and end
-- the request's claim either way. A token is deleted only if it is still the one that was used,
-- so a newer token (the user entered again and was admitted again) is never removed, and a claim
-- only if it is still that request's. One call carries a group of settles (the members), taken
-- in their order, each exactly as if it had been a call of its own.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  tokens (live tokens, see admit.lua),
--       then from KEYS[KEYS_REST], two per member:
--       user_token (the user's token), user_claim (the claim on it)
-- ARGV  spent_channel (where spent tokens are announced: a channel, not a key), members (how
--       many),
--       then from ARGV[REST], four per member:
--       token (the one that was used), user, claim (the request's claim id, '' for none),
--       spend ('1': the order succeeded)
-- Returns one reply per member, in their order: 1 when its token was deleted, else 0.
--
-- A spent token is announced on spent_channel as '<ms it had left> <token> <user>' before it
-- is deleted: every proxy subscribed then remembers it, refuses it even if Redis loses this write
-- (a restart from an older snapshot, a failover to a replica that lagged), and runs this script
-- again once it notices such a loss (with no claim), so Redis forgets the token once more.

local function settle(user_token, user_claim, token, user, claim, spend)
  if redis.call('GET', user_claim) == claim then
    redis.call('DEL', user_claim)
  end
  if spend and redis.call('GET', user_token) == token then
    redis.call('PUBLISH', spent_channel, redis.call('PTTL', user_token) .. ' ' .. token .. ' ' .. user)
    redis.call('ZREM', tokens, user)
    return redis.call('DEL', user_token)
  end
  return 0
end

local replies = {}
for i = 0, tonumber(members) - 1 do
  local k, a = KEYS_REST + 2 * i, REST + 4 * i
  replies[i + 1] = settle(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3] == '1')
end
return replies
