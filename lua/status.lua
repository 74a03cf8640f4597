-- Where a user stands: waiting (and where), admitted (and the token), or neither.
-- A script rather than a pipeline so that an admission can never fall between the two reads.
--
-- KEYS[1] the line, KEYS[2] this user's token, KEYS[3] this user's poll clock
-- ARGV[1] user, ARGV[2..] the poll clock (see poll_clock.lua)
--
-- Returns {"WAITING", position} | {"READY", token, pttl_ms} | {"NOT_IN_QUEUE"}
--       | {"TOO_EARLY", seconds until the call would be on time}

local CLOCK = 2

-- A refused call does not restart the clock.
if enforcing(CLOCK) then
  local on_time = tonumber(redis.call('GET', KEYS[3]))
  if on_time then
    local now = now_ms()
    if now < on_time then
      return {'TOO_EARLY', math.max(1, math.ceil((on_time - now) / 1000))}
    end
  end
end

local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then
  start_poll_clock(KEYS[3], rank + 1, CLOCK)
  return {'WAITING', rank + 1}
end

stop_poll_clock(KEYS[3], CLOCK)
local token = redis.call('GET', KEYS[2])
if token then
  return {'READY', token, redis.call('PTTL', KEYS[2])}
end

return {'NOT_IN_QUEUE'}
