-- One admission tick for the whole room. Every proxy calls this when it believes an interval is
-- due; Redis's own clock and the stored schedule decide, so however many proxies call, the room
-- admits at most one batch per interval, and the others learn how long to sleep.
-- Built after a prelude that binds the names below (declared in src/store/admit.rs) and after
-- lua/admission.lua, lua/room_state.lua and lua/room_clock.lua.
--
-- KEYS
--   queue            the line
--   next_admission   the schedule: when the next admission is due, in microseconds of Redis TIME
--   tokens           live tokens (sorted set, member = user, score = expiry in ms)
--   adaptive         the adaptive controller's state (see adapt.lua): the batch in force
--   admission_spent  the budget the interval in progress has spent (hash: due = the schedule
--                    value that ends the interval, count = users admitted in it), shared with
--                    instant passes
--   admissions       the admissions log, for the measured rate (see record_admissions)
--   heard            when each waiting user was last heard from (sorted set, score = the room's
--                    time in ms, see room_clock.lua), for abandonment; deleted while
--                    abandonment is off, so nothing is remembered against anyone then
--   room_clock       the room's clock (see room_clock.lua)
--   room             the room's state: only an open room admits (see room_state.lua)
--   admitted_minute  admissions per second of the last minute (see room_state.lua)
-- The admitted users' token keys (token_prefix .. user) cannot be declared: who is admitted is
-- known only once they are popped, inside this script. They share the room's hash tag with
-- every declared key, so a Redis Cluster still finds them all in one slot.
-- ARGV
--   interval_us, batch_size (the ceiling with adaptive), ttl_ms (the tokens'),
--   token_prefix     the token key prefix (the user is appended),
--   max_active (0 = no cap), min_batch (0 = not adaptive),
--   instant          instant passes share the interval's batch (record what the tick spent),
--   abandon_ms (0 = off), listens (log admissions for the measured rate),
--   opens_us, closes_us (a scheduled event's opening and close in Redis TIME microseconds, 0 =
--                    none): nobody is admitted before the opening, so the pre-queue waits for its
--                    draw, nor from the close, which ends the line (see event.lua),
--   keeps_time       abandonment or enforced polling is on: advance the room's clock
--   from ARGV[REST], one fresh random token per place in the batch (Lua has no secure randomness)
--
-- Reply, in the order src/store/admit.rs declares it (AdmitReply): admitted, wait_us (until the
-- next admission is due), was_due (1: this call was the due one), abandoned (places removed),
-- batch (the batch in force, 0 when not due), passed (the score of the last place popped from
-- the front, as Redis wrote it; absent when none was).
-- Numbers arrive as text (see src/store/script.rs).

local SWEEP_MAX = 1000

-- Before anything else, the early answer included: every proxy's tick keeps the room's clock.
abandon_ms = tonumber(abandon_ms)
local room_now = nil
if keeps_time or abandon_ms > 0 then
  room_now = room_time()
end
if abandon_ms <= 0 then
  -- Switched off (or never on): entries from an earlier time must not count when it is
  -- switched on again, against users who kept polling meanwhile unrecorded.
  redis.call('DEL', heard)
end

local now = redis_now_us()
interval_us = tonumber(interval_us)

-- Paused or closed (room_state.lua): nobody is admitted and the schedule is left as it is; on
-- resume the schedule is a whole interval late, so next_tick restarts it from then, no burst.
if room_state_of(room) ~= 'open' then
  return {0, interval_us, 0, 0, 0}
end
opens_us = tonumber(opens_us)
if now < opens_us then
  return {0, math.min(opens_us - now, interval_us), 0, 0, 0}
end
closes_us = tonumber(closes_us)
if closes_us > 0 and now >= closes_us then
  return {0, interval_us, 0, 0, 0}
end
local due = tonumber(redis.call('GET', next_admission) or '0')

if now < due then
  if due - now <= interval_us then
    return {0, due - now, 0, 0, 0}
  end
  -- A schedule left by a longer interval (before a reload or a restart) must not hold back
  -- this one: re-anchor it to the caller's interval.
  redis.call('SET', next_admission, int_text(now + interval_us))
  return {0, interval_us, 0, 0, 0}
end

local next_due = next_tick(due, now, interval_us)
redis.call('SET', next_admission, int_text(next_due))

local now_ms = math.floor(now / 1000)
ttl_ms = tonumber(ttl_ms)

-- Users who stopped polling leave before anyone is admitted: the places behind them move up
-- within this interval, and no token goes to a closed tab. Bounded per tick; the pop below
-- checks every user it takes anyway.
local abandoned = 0
if abandon_ms > 0 then
  local stale = redis.call('ZRANGEBYSCORE', heard, '-inf', '(' .. int_text(room_now - abandon_ms),
    'LIMIT', 0, SWEEP_MAX)
  if #stale > 0 then
    redis.call('ZREM', heard, unpack(stale))
    abandoned = redis.call('ZREM', queue, unpack(stale))
  end
end

local batch = batch_in_force(adaptive, tonumber(batch_size), tonumber(min_batch))
local budget = math.min(batch, room_under_cap(tokens, tonumber(max_active), now_ms))

-- Popping and issuing in one script: a crash can never pop a user without a token, or twice.
local admitted = 0
-- Everyone up to this score has left the front: the calling proxy's local answers must not show
-- them waiting from a reading taken before this tick (see src/room/line.rs).
local passed = nil
local function admit(user)
  admitted = admitted + 1
  issue_token(token_prefix .. user, tokens, user, ARGV[REST - 1 + admitted], ttl_ms, now_ms)
end

if budget > 0 and abandon_ms <= 0 then
  local popped = redis.call('ZPOPMIN', queue, budget)
  for i = 1, #popped, 2 do
    admit(popped[i])
    passed = popped[i + 1]
  end
elseif budget > 0 then
  -- In line order; a user the sweep did not reach who is stale loses the place, and the next
  -- one is taken instead.
  local rounds = 0
  while admitted < budget and rounds < 50 do
    rounds = rounds + 1
    local popped = redis.call('ZPOPMIN', queue, budget - admitted)
    if #popped == 0 then break end
    for i = 1, #popped, 2 do
      local user = popped[i]
      if is_stale(heard, user, abandon_ms, room_now) then
        abandoned = abandoned + 1
      else
        admit(user)
      end
      redis.call('ZREM', heard, user)
      passed = popped[i + 1]
    end
  end
end

if instant then
  redis.call('HSET', admission_spent, 'due', int_text(next_due), 'count', admitted)
end
if listens then
  record_admissions(admissions, admitted, now_ms)
end
count_admitted(admitted_minute, admitted, now_ms)
-- A nil `passed` ends the array before it.
return {admitted, next_due - now, 1, abandoned, batch, passed}
