-- Claim the user's token for one protected request (contract section 12): one admission, one
-- order. The check that the presented token is the user's current one and the claim are one
-- step, so of any number of parallel requests with the same token exactly one is forwarded.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  user_token (the user's token), user_claim (the claim on it)
-- ARGV  token (the one presented), claim (this request's id), claim_ms (how long a claim left by
--       a proxy that died holds; never past the token's own expiry)
-- Returns {'CLAIMED'}, {'IN_USE'} (another request holds the claim) or {'INVALID'}.

local current = redis.call('GET', user_token)
-- Hashes compared, not the tokens: how long a comparison takes tells nothing about the token.
if not current or redis.sha1hex(current) ~= redis.sha1hex(token) then
  return {'INVALID'}
end
local left = redis.call('PTTL', user_token)
if left == -2 then
  return {'INVALID'}
end
local hold = tonumber(claim_ms)
if left > 0 and left < hold then
  hold = left
end
if redis.call('SET', user_claim, claim, 'NX', 'PX', hold) then
  return {'CLAIMED'}
end
return {'IN_USE'}
