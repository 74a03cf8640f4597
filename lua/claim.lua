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
-- Returns one reply per member, in their order, in one flat array: 'CLAIMED', 'IN_USE' (another
-- request holds the claim) or 'INVALID' (a table a member would cost Redis its checks for the
-- special fields of a reply, and the proxy an array more to parse).

local hold_ms = tonumber(claim_ms)

-- `current` is the user's token as Redis holds it (false for none).
local function claim_one(user_token, user_claim, token, claim, current)
  -- Redis's Lua (5.1) interns every string, so `~=` compares two pointers: its time tells
  -- nothing about how much of the token was right. Hashing both first would cost Redis about 7k
  -- instructions a claim and hide nothing more: the bytes meet only when Redis interns the
  -- presented token into ARGV, before any line here runs.
  if not current or current ~= token then
    return 'INVALID'
  end
  local left = redis.call('PTTL', user_token)
  if left == -2 then
    return 'INVALID'
  end
  -- The group's hold as it came, in text: Redis writes a number argument with snprintf.
  local hold = claim_ms
  if left > 0 and left < hold_ms then
    hold = left
  end
  if redis.call('SET', user_claim, claim, 'NX', 'PX', hold) then
    return 'CLAIMED'
  end
  return 'IN_USE'
end

-- The tokens, with one MGET for the group rather than a GET a member: a claim never changes a
-- token, so what the first member reads is what the last would. (The claims themselves are
-- taken one by one: a member finds the claims of the members before it.)
local n = tonumber(members)
local keys, argv = KEYS, ARGV
local token_keys = {}
for i = 1, n do
  token_keys[i] = keys[KEYS_REST + 2 * (i - 1)]
end
local current = redis.call('MGET', unpack(token_keys, 1, n))
local replies = {}
for i = 1, n do
  local k, a = KEYS_REST + 2 * (i - 1), REST + 2 * (i - 1)
  replies[i] = claim_one(keys[k], keys[k + 1], argv[a], argv[a + 1], current[i])
end
return replies
