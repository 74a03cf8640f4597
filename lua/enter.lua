-- Enter the line: one atomic step, so no burst of concurrent enters can exceed the capacity,
-- share a number, or hold two places for one user.
--
-- KEYS[1] the line (sorted set, member = user, score = arrival number)
-- KEYS[2] the arrival counter
-- KEYS[3] this user's token
-- KEYS[4] this user's poll clock (see poll_clock.lua)
-- KEYS[5] the client address's identity counter, without its window (the script appends it)
-- ARGV[1] user, ARGV[2] capacity,
-- ARGV[3] identities per address per minute (0 = no limit), ARGV[4..] the poll clock
--
-- Returns {"READY", token, pttl_ms} | {"WAITING", position, 0 = new / 1 = already waiting}
--       | {"FULL"} | {"LIMITED", seconds until the address's window ends}

local CLOCK = 4

local token = redis.call('GET', KEYS[3])
if token then
  stop_poll_clock(KEYS[4], CLOCK)
  return {'READY', token, redis.call('PTTL', KEYS[3])}
end

local rank = redis.call('ZRANK', KEYS[1], ARGV[1])
if rank then
  start_poll_clock(KEYS[4], rank + 1, CLOCK)
  return {'WAITING', rank + 1, 1}
end

-- Hoarding places with many identities from one address: only new places are limited.
local limit = tonumber(ARGV[3])
if limit > 0 then
  local now = now_ms()
  local window = math.floor(now / 60000)
  local counter = KEYS[5] .. ':' .. window
  if redis.call('SISMEMBER', counter, ARGV[1]) == 0 then
    if redis.call('SCARD', counter) >= limit then
      return {'LIMITED', math.max(1, math.ceil(((window + 1) * 60000 - now) / 1000))}
    end
    redis.call('SADD', counter, ARGV[1])
    redis.call('EXPIRE', counter, 120)
  end
end

if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return {'FULL'}
end

-- The score is Redis's own counter, never a server clock: arrival order at Redis is the order.
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], 'NX', seq, ARGV[1])
-- The newest number is the largest, so the new place is the last one.
local position = redis.call('ZCARD', KEYS[1])
start_poll_clock(KEYS[4], position, CLOCK)
return {'WAITING', position, 0}
