-- One admission tick for the whole room. Every proxy calls this when it believes an interval is
-- due; Redis's own clock and the stored schedule decide, so however many proxies call, the room
-- admits at most one batch per interval, and the others learn how long to sleep.
-- lua/admission.lua is prepended (the shared helpers).
--
-- KEYS[1] the line
-- KEYS[2] the schedule: when the next admission is due, in microseconds of Redis TIME
-- KEYS[3] live tokens (sorted set, member = user, score = expiry in ms)
-- KEYS[4] the adaptive controller's state (see adapt.lua): the batch in force
-- KEYS[5] the budget the interval in progress has spent (hash: due = the schedule value that
--         ends the interval, count = users admitted in it), shared with instant passes
-- KEYS[6] the admissions log, for the measured rate (see record_admissions)
-- KEYS[7] when each waiting user was last heard from (sorted set, score = ms), for abandonment
-- ARGV[1] interval (us), ARGV[2] batch size (the ceiling with adaptive), ARGV[3] token ttl (ms),
-- ARGV[4] the token key prefix (the user is appended),
-- ARGV[5] max_active (0 = no cap), ARGV[6] min_batch (0 = not adaptive),
-- ARGV[7] 1 = instant passes share the interval's batch (record what the tick spent),
-- ARGV[8] abandon_after (ms, 0 = off), ARGV[9] 1 = log admissions for the measured rate,
-- ARGV[10..] one fresh random token per place in the batch (Lua has no secure randomness)
--
-- Returns {admitted, microseconds until the next admission is due, 1 if this call was the due
-- one, places abandoned, the batch in force (0 when not due)}

local TOKENS = 10
local SWEEP_MAX = 1000

local now = redis_now_us()
local interval = tonumber(ARGV[1])
local due = tonumber(redis.call('GET', KEYS[2]) or '0')

if now < due then
  if due - now <= interval then
    return {0, due - now, 0, 0, 0}
  end
  -- A schedule left by a longer interval (before a reload or a restart) must not hold back
  -- this one: re-anchor it to the caller's interval.
  redis.call('SET', KEYS[2], int_text(now + interval))
  return {0, interval, 0, 0, 0}
end

local next_due = next_tick(due, now, interval)
redis.call('SET', KEYS[2], int_text(next_due))

local now_ms = math.floor(now / 1000)
local ttl = tonumber(ARGV[3])
local abandon = tonumber(ARGV[8])

-- Users who stopped polling leave before anyone is admitted: the places behind them move up
-- within this interval, and no token goes to a closed tab. Bounded per tick; the pop below
-- checks every user it takes anyway.
local abandoned = 0
if abandon > 0 then
  local stale = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', '(' .. int_text(now_ms - abandon),
    'LIMIT', 0, SWEEP_MAX)
  if #stale > 0 then
    redis.call('ZREM', KEYS[7], unpack(stale))
    abandoned = redis.call('ZREM', KEYS[1], unpack(stale))
  end
end

local batch = batch_in_force(KEYS[4], tonumber(ARGV[2]), tonumber(ARGV[6]))
local budget = math.min(batch, room_under_cap(KEYS[3], tonumber(ARGV[5]), now_ms))

-- Popping and issuing in one script: a crash can never pop a user without a token, or twice.
local admitted = 0
local function admit(user)
  admitted = admitted + 1
  issue_token(ARGV[4] .. user, KEYS[3], user, ARGV[TOKENS - 1 + admitted], ttl, now_ms)
end

if budget > 0 and abandon <= 0 then
  local popped = redis.call('ZPOPMIN', KEYS[1], budget)
  for i = 1, #popped, 2 do
    admit(popped[i])
  end
elseif budget > 0 then
  -- In line order; a user the sweep did not reach who is stale loses the place, and the next
  -- one is taken instead.
  local rounds = 0
  while admitted < budget and rounds < 50 do
    rounds = rounds + 1
    local popped = redis.call('ZPOPMIN', KEYS[1], budget - admitted)
    if #popped == 0 then break end
    for i = 1, #popped, 2 do
      local user = popped[i]
      if is_stale(KEYS[7], user, abandon, now_ms) then
        abandoned = abandoned + 1
      else
        admit(user)
      end
      redis.call('ZREM', KEYS[7], user)
    end
  end
end

if ARGV[7] == '1' then
  redis.call('HSET', KEYS[5], 'due', int_text(next_due), 'count', admitted)
end
if ARGV[9] == '1' then
  record_admissions(KEYS[6], admitted, now_ms)
end
return {admitted, next_due - now, 1, abandoned, batch}
