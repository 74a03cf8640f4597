-- Where a user stands: waiting (and where), admitted (and the token), or neither.
-- A script because it may write (abandonment, the poll clock); without either the proxy sends
-- the same reads as one MULTI/EXEC instead (src/store/mod.rs, read_status).
-- lua/poll_clock.lua is prepended.
--
-- KEYS[1] the line, KEYS[2] this user's token, KEYS[3] this user's poll clock,
-- KEYS[4] heard-from times (see admit.lua)
-- ARGV[1] user, ARGV[2] abandon_after (ms, 0 = off), ARGV[3..] the poll clock
--
-- Returns {"WAITING", position} | {"READY", token, pttl_ms} | {"NOT_IN_QUEUE", abandoned}
--       | {"TOO_EARLY", seconds until the call would be on time}
-- where abandoned is 1 when this call found the user's place lost and removed it.

local CLOCK = 3
local user = ARGV[1]
local abandon = tonumber(ARGV[2])

-- Abandonment: every call counts as heard from, one refused as TOO_EARLY below included; a call
-- that comes too late finds the place gone.
local lost = 0
local heard = nil
if abandon > 0 then
  local now = now_ms()
  heard = tonumber(redis.call('ZSCORE', KEYS[4], user))
  if heard and now - heard > abandon then
    lost = redis.call('ZREM', KEYS[1], user)
    redis.call('ZREM', KEYS[4], user)
  elseif heard then
    redis.call('ZADD', KEYS[4], now, user)
  end
end

-- A refused call does not restart the clock.
if lost == 0 and enforcing(CLOCK) then
  local on_time = tonumber(redis.call('GET', KEYS[3]))
  if on_time then
    local now = now_ms()
    if now < on_time then
      return {'TOO_EARLY', math.max(1, math.ceil((on_time - now) / 1000))}
    end
  end
end

local rank = redis.call('ZRANK', KEYS[1], user)
if rank then
  if abandon > 0 and not heard then
    -- Queued before abandonment was switched on: tracked from now.
    redis.call('ZADD', KEYS[4], now_ms(), user)
  end
  start_poll_clock(KEYS[3], rank + 1, CLOCK)
  return {'WAITING', rank + 1}
end

stop_poll_clock(KEYS[3], CLOCK)
local token = redis.call('GET', KEYS[2])
if token then
  return {'READY', token, redis.call('PTTL', KEYS[2])}
end

return {'NOT_IN_QUEUE', lost}
