-- Keep the claims of orders still in flight alive (contract section 12: a claim lasts as long as
-- its request, however slowly the client sends its body). Each proxy sends the claims it holds,
-- a group at a time, well within claim_timeout; a claim whose proxy died is sent by nobody and
-- expires after claim_timeout, as before.
-- After a prelude that binds the names below (declared in src/store/consume.rs).
--
-- KEYS  from KEYS[KEYS_REST], two per member:
--       user_token (the user's token), user_claim (the claim on it)
-- ARGV  claim_ms (how long a claim holds from now; never past the token's own expiry), members
--       (how many),
--       then from ARGV[REST], one per member: claim (the request's claim id)
-- Returns how many claims were still this proxy's and were kept.
--
-- A claim is kept only while it is still the request's own (an ended or replaced claim is never
-- brought back), and never past its token's expiry: an order in flight when its token expires
-- keeps no claim on a token that is gone.

local hold_ms = tonumber(claim_ms)
local n = tonumber(members)
local keys, argv = KEYS, ARGV
local kept = 0
for i = 1, n do
  local k = KEYS_REST + 2 * (i - 1)
  local user_token, user_claim = keys[k], keys[k + 1]
  if redis.call('GET', user_claim) == argv[REST + i - 1] then
    local left = redis.call('PTTL', user_token)
    if left > 0 then
      redis.call('PEXPIRE', user_claim, math.min(left, hold_ms))
      kept = kept + 1
    elseif left == -1 then
      redis.call('PEXPIRE', user_claim, hold_ms)
      kept = kept + 1
    end
  end
end
return kept
