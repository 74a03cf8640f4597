-- Enter the line: one atomic step, so no burst of concurrent enters can exceed the capacity,
-- share a number, or hold two places for one user. lua/poll_clock.lua and lua/admission.lua are
-- prepended.
--
-- KEYS[1] the line (sorted set, member = user, score = arrival number)
-- KEYS[2] the arrival counter
-- KEYS[3] this user's token
-- KEYS[4] this user's poll clock (see poll_clock.lua)
-- KEYS[5] the client address's identity counter, without its window (the script appends it)
-- KEYS[6] live tokens, KEYS[7] the admission schedule, KEYS[8] the interval's spent budget,
-- KEYS[9] the adaptive state, KEYS[10] the admissions log, KEYS[11] heard-from times
--         (all as in admit.lua)
-- KEYS[12] the room's epoch (see src/line.rs)
-- ARGV[1] user, ARGV[2] capacity, ARGV[3] identities per address per minute (0 = no limit),
-- ARGV[4] abandon_after (ms, 0 = off),
-- ARGV[5] instant: the token to issue if this user may pass at once, '' when instant is off,
-- ARGV[6] token ttl (ms), ARGV[7] interval (us), ARGV[8] batch size, ARGV[9] min_batch
-- (0 = not adaptive), ARGV[10] max_active (0 = no cap), ARGV[11] 1 = log admissions,
-- ARGV[12..] the poll clock
--
-- Returns {"READY", token, pttl_ms, 1 = an instant pass given now / 0, abandoned}
--       | {"WAITING", position, 0 = new / 1 = already waiting, abandoned, arrival number, epoch}
--       | {"FULL", abandoned} | {"LIMITED", seconds until the address's window ends, abandoned}
-- where abandoned (0 or 1) says this call found the user's place lost and removed it.

local CLOCK = 12
local user = ARGV[1]
local abandon = tonumber(ARGV[4])

local token = redis.call('GET', KEYS[3])
if token then
  stop_poll_clock(KEYS[4], CLOCK)
  return {'READY', token, redis.call('PTTL', KEYS[3]), 0, 0}
end

local abandoned = 0
local rank = redis.call('ZRANK', KEYS[1], user)
if rank and abandon > 0 then
  local now = now_ms()
  if is_stale(KEYS[11], user, abandon, now) then
    -- Not heard from for too long: the place is lost, and this enter queues at the back.
    redis.call('ZREM', KEYS[1], user)
    abandoned = 1
    rank = nil
  else
    redis.call('ZADD', KEYS[11], now, user)
  end
end
if rank then
  start_poll_clock(KEYS[4], rank + 1, CLOCK)
  return {'WAITING', rank + 1, 1, 0, tonumber(redis.call('ZSCORE', KEYS[1], user)), redis.call('GET', KEYS[12])}
end

-- Hoarding places with many identities from one address: only new places are limited.
local limit = tonumber(ARGV[3])
if limit > 0 then
  local now = now_ms()
  local window = math.floor(now / 60000)
  local counter = KEYS[5] .. ':' .. window
  if redis.call('SISMEMBER', counter, user) == 0 then
    if redis.call('SCARD', counter) >= limit then
      return {'LIMITED', math.max(1, math.ceil(((window + 1) * 60000 - now) / 1000)), abandoned}
    end
    redis.call('SADD', counter, user)
    redis.call('EXPIRE', counter, 120)
  end
end

-- The instant pass: nobody waits and the interval in progress has room left. It is an
-- admission like the tick's: it spends the same interval's batch in force and respects
-- max_active, so the room never admits more than its batch per interval.
local function instant_pass()
  if redis.call('ZCARD', KEYS[1]) > 0 then return false end
  local now = redis_now_us()
  local ms = math.floor(now / 1000)
  local due = tonumber(redis.call('GET', KEYS[7]) or '0')
  local next_due = due
  local spent = 0
  if now >= due then
    -- The tick that opens the next interval is due but has not run; with nobody waiting it
    -- would admit no one, so open that interval here, exactly as it would have.
    next_due = next_tick(due, now, tonumber(ARGV[7]))
  else
    local budget = redis.call('HMGET', KEYS[8], 'due', 'count')
    if tonumber(budget[1]) == due then spent = tonumber(budget[2]) or 0 end
  end
  if spent >= batch_in_force(KEYS[9], tonumber(ARGV[8]), tonumber(ARGV[9])) then return false end
  if room_under_cap(KEYS[6], tonumber(ARGV[10]), ms) < 1 then return false end
  if next_due ~= due then
    redis.call('SET', KEYS[7], int_text(next_due))
  end
  redis.call('HSET', KEYS[8], 'due', int_text(next_due), 'count', spent + 1)
  issue_token(KEYS[3], KEYS[6], user, ARGV[5], tonumber(ARGV[6]), ms)
  if ARGV[11] == '1' then record_admissions(KEYS[10], 1, ms) end
  return true
end

if ARGV[5] ~= '' and instant_pass() then
  stop_poll_clock(KEYS[4], CLOCK)
  return {'READY', ARGV[5], redis.call('PTTL', KEYS[3]), 1, abandoned}
end

if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return {'FULL', abandoned}
end

-- The score is Redis's own counter, never a server clock: arrival order at Redis is the order.
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], 'NX', seq, user)
if abandon > 0 then
  redis.call('ZADD', KEYS[11], now_ms(), user)
end
-- The newest number is the largest, so the new place is the last one.
local position = redis.call('ZCARD', KEYS[1])
start_poll_clock(KEYS[4], position, CLOCK)
return {'WAITING', position, 0, abandoned, seq, redis.call('GET', KEYS[12])}
