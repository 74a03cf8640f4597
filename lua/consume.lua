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

local n = tonumber(members)
local keys, argv, format = KEYS, ARGV, string.format

-- The claims and tokens as Redis holds them before the group changes anything, with one MGET
-- each rather than two GETs a member; the keys to delete and the spent users, with one DEL and
-- one ZREM at the end. A member sees what the members before it did: a user who came earlier in
-- the same call has the deletes written first and reads again (`seen`).
local claim_keys, token_keys = {}, {}
for i = 1, n do
  local k = KEYS_REST + 2 * (i - 1)
  token_keys[i], claim_keys[i] = keys[k], keys[k + 1]
end
local claims_now = redis.call('MGET', unpack(claim_keys, 1, n))
local tokens_now = redis.call('MGET', unpack(token_keys, 1, n))
local gone, gone_n = {}, 0
local spent_users, spent_n = {}, 0
local function write_deletes()
  if gone_n > 0 then
    redis.call('DEL', unpack(gone, 1, gone_n))
    gone_n = 0
  end
  if spent_n > 0 then
    redis.call('ZREM', tokens, unpack(spent_users, 1, spent_n))
    spent_n = 0
  end
end

local seen = {}
local replies = {}
for i = 1, n do
  local a = REST + 4 * (i - 1)
  local token, user, claim, spend = argv[a], argv[a + 1], argv[a + 2], argv[a + 3] == '1'
  local user_token, user_claim = token_keys[i], claim_keys[i]
  local claim_now, token_now = claims_now[i], tokens_now[i]
  if seen[user] then
    write_deletes()
    claim_now, token_now = redis.call('GET', user_claim), redis.call('GET', user_token)
  end
  seen[user] = true
  if claim_now == claim then
    gone_n = gone_n + 1
    gone[gone_n] = user_claim
  end
  if spend and token_now == token then
    -- '%d': a number joined as it is goes through '%.14g', a third dearer in Redis's Lua.
    redis.call('PUBLISH', spent_channel, format('%d', redis.call('PTTL', user_token)) .. ' ' .. token .. ' ' .. user)
    gone_n = gone_n + 1
    gone[gone_n] = user_token
    spent_n = spent_n + 1
    spent_users[spent_n] = user
    replies[i] = 1
  else
    replies[i] = 0
  end
end
write_deletes()
return replies
