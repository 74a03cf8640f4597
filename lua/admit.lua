-- One admission tick for the whole room. Every proxy calls this when it believes an interval is
-- due; Redis's own clock and the stored schedule decide, so however many proxies call, the room
-- admits at most one batch per interval, and the others learn how long to sleep.
--
-- KEYS[1] the line
-- KEYS[2] the schedule: when the next admission is due, in microseconds of Redis TIME
-- KEYS[3] live tokens (sorted set, member = user, score = expiry in ms), for counting them
-- ARGV[1] interval (us), ARGV[2] batch size, ARGV[3] token ttl (ms),
-- ARGV[4] the token key prefix (the user is appended),
-- ARGV[5..] one fresh random token per place in the batch (Lua has no secure randomness)
--
-- Returns {admitted, microseconds until the next admission is due, 1 if this call was the due one}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local due = tonumber(redis.call('GET', KEYS[2]) or '0')

if now < due then
  if due - now <= interval then
    return {0, due - now, 0}
  end
  -- A schedule left by a longer interval (before a reload or a restart) must not hold back
  -- this one: re-anchor it to the caller's interval.
  redis.call('SET', KEYS[2], string.format('%.0f', now + interval))
  return {0, interval, 0}
end

-- Keep the schedule's phase while ticks are merely late; after a whole missed interval (no proxy
-- ran), restart from now instead of making up the backlog in one burst.
local next_due = due + interval
if next_due <= now then
  next_due = now + interval
end
redis.call('SET', KEYS[2], string.format('%.0f', next_due))

-- Popping and issuing in one script: a crash can never pop a user without a token, or twice.
local popped = redis.call('ZPOPMIN', KEYS[1], tonumber(ARGV[2]))
local expires = string.format('%.0f', math.floor(now / 1000) + tonumber(ARGV[3]))
local admitted = 0
for i = 1, #popped, 2 do
  admitted = admitted + 1
  redis.call('SET', ARGV[4] .. popped[i], ARGV[4 + admitted], 'PX', ARGV[3])
  redis.call('ZADD', KEYS[3], expires, popped[i])
end
return {admitted, next_due - now, 1}
