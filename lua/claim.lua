-- Claim users' tokens, each for one protected request (contract section 12): one admission, one
-- order. The check that the presented token is the user's current one and the claim are one
-- step, so of any number of parallel requests with the same token exactly one is forwarded. One
-- call carries a group of claims (the members), taken in their order, each exactly as if it had
-- been a call of its own: two members with the same token are two parallel requests, and the
-- second finds the first's claim.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  from KEYS[KEYS_REST], two per member:
--       user_token (the user's token), user_claim (the claim on it)
-- ARGV  claim_ms (how long a claim left by a proxy that died holds; never past the token's own
--       expiry), members (how many),
--       then from ARGV[REST], two per member:
--       token (the one presented), claim (this request's id)
-- Returns one reply per member, in their order: {'CLAIMED'}, {'IN_USE'} (another request holds
-- the claim) or {'INVALID'}.

local hold_ms = tonumber(claim_ms)

local function claim_one(user_token, user_claim, token, claim)
  local current = redis.call('GET', user_token)
  -- Hashes compared, not the tokens: how long a comparison takes tells nothing about the token.
  if not current or redis.sha1hex(current) ~= redis.sha1hex(token) then
    return {'INVALID'}
  end
  local left = redis.call('PTTL', user_token)
  if left == -2 then
    return {'INVALID'}
  end
  local hold = hold_ms
  if left > 0 and left < hold then
    hold = left
  end
  if redis.call('SET', user_claim, claim, 'NX', 'PX', hold) then
    return {'CLAIMED'}
  end
  return {'IN_USE'}
end

local replies = {}
for i = 0, tonumber(members) - 1 do
  local k, a = KEYS_REST + 2 * i, REST + 2 * i
  replies[i + 1] = claim_one(KEYS[k], KEYS[k + 1], ARGV[a], ARGV[a + 1])
end
return replies
