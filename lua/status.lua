-- Where a user stands: waiting (and where), admitted (and the token), or neither.
-- A script because it may write (abandonment, the poll clock); without either the proxy sends
-- the same reads as one MULTI/EXEC instead (src/store/status.rs, read_status).
-- Built after a prelude that binds the names below (declared in src/store/status.rs) and after
-- lua/poll_clock.lua.
--
-- KEYS  queue (the line), user_token, user_clock (see poll_clock.lua), heard (heard-from times,
--       in the room's time, see admit.lua), room_clock (see room_clock.lua)
-- ARGV  user, abandon_ms (0 = off), poll_factor and, from ARGV[REST], the poll clock's tiers
--
-- Replies: a tag, then its fields in the order src/store/status.rs declares them (StatusReply):
--   WAITING       position, score (the user's score in the line, for held polls)
--   READY         token, remaining_ms
--   NOT_IN_QUEUE  abandoned (1 when this call found the user's place lost and removed it)
--   TOO_EARLY     retry_secs (until the call would be on time)
-- Numbers arrive as text (see src/store/script.rs).

abandon_ms = tonumber(abandon_ms)
local room_now = nil
if abandon_ms > 0 or enforcing() then
  room_now = room_time()
end

-- Abandonment: every call counts as heard from, one refused as TOO_EARLY below included; a call
-- that comes too late finds the place gone.
local lost = 0
local heard_at = nil
if abandon_ms > 0 then
  heard_at = tonumber(redis.call('ZSCORE', heard, user))
  if heard_at and room_now - heard_at > abandon_ms then
    lost = redis.call('ZREM', queue, user)
    redis.call('ZREM', heard, user)
  elseif heard_at then
    redis.call('ZADD', heard, string.format('%.0f', room_now), user)
  end
end

-- A refused call does not restart the clock.
if lost == 0 and enforcing() then
  local on_time = tonumber(redis.call('GET', user_clock))
  local now = now_ms()
  if too_early(on_time, now) then
    return {'TOO_EARLY', math.max(1, math.ceil((on_time - now) / 1000))}
  end
end

local rank = redis.call('ZRANK', queue, user)
if rank then
  if abandon_ms > 0 and not heard_at then
    -- Queued before abandonment was switched on: tracked from now.
    redis.call('ZADD', heard, string.format('%.0f', room_now), user)
  end
  start_poll_clock(user_clock, rank + 1)
  return {'WAITING', rank + 1, redis.call('ZSCORE', queue, user)}
end

stop_poll_clock(user_clock)
local token = redis.call('GET', user_token)
if token then
  return {'READY', token, redis.call('PTTL', user_token)}
end

return {'NOT_IN_QUEUE', lost}
