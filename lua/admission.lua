-- Shared by admit.lua and enter.lua: placed after their generated prelude when the binary is
-- built (src/store/script.rs). Everything a helper needs comes as a parameter.
--
-- The admission switches of contract section 11 (instant, max_active, adaptive) and the
-- abandonment of queue.abandon_after. The proxy hands each over as data, 0 meaning off; every
-- helper below runs only when its switch is on, so a room with every switch off does exactly the
-- Redis work it did before they existed.

-- Redis's clock in microseconds: schedules and expiries follow it, never a proxy's clock.
local function redis_now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function int_text(n)
  return string.format('%.0f', n)
end

-- When the tick after one due at `due` is due: keep the schedule's phase while ticks are merely
-- late; after a whole missed interval (no proxy ran), restart from now instead of making up the
-- backlog in one burst.
local function next_tick(due, now, interval)
  local next_due = due + interval
  if next_due <= now then
    next_due = now + interval
  end
  return next_due
end

-- The room's batch in force: the adaptive controller's (adapt.lua), within the bounds configured
-- now (a reload may have moved them), or batch_size when nothing adapts (min_batch 0) or the
-- controller has not stepped yet.
local function batch_in_force(state_key, batch_size, min_batch)
  if min_batch <= 0 then return batch_size end
  local stored = tonumber(redis.call('HGET', state_key, 'batch'))
  if not stored then return batch_size end
  return math.max(min_batch, math.min(batch_size, stored))
end

-- How many more tokens max_active allows now (0 = no cap). Expired tokens leave the live-token
-- set first: Redis expires the token keys themselves, the set only through its scores.
local function room_under_cap(tokens_key, max_active, now_ms)
  if max_active <= 0 then return math.huge end
  redis.call('ZREMRANGEBYSCORE', tokens_key, '-inf', int_text(now_ms))
  return math.max(0, max_active - redis.call('ZCARD', tokens_key))
end

-- One admission: the token (a fresh UUID v4 from the proxy: Lua has no secure randomness) lives
-- ttl ms, and the live-token set learns when it expires.
local function issue_token(token_key, tokens_key, user, token, ttl_ms, now_ms)
  redis.call('SET', token_key, token, 'PX', ttl_ms)
  redis.call('ZADD', tokens_key, int_text(now_ms + ttl_ms), user)
end

-- The measured admission rate (stats.lua sums and prunes it): admissions per 100 ms bucket,
-- and when the room first admitted anyone.
local LOG_BUCKET_MS = 100
local function record_admissions(log_key, n, now_ms)
  if n <= 0 then return end
  redis.call('HINCRBY', log_key, int_text(math.floor(now_ms / LOG_BUCKET_MS)), n)
  redis.call('HSETNX', log_key, 'first', int_text(now_ms))
end

-- Abandonment: a waiting user last heard from more than abandon_ms ago has lost the place.
-- Users the heard-from set does not know (queued before abandonment was switched on) are not.
local function is_stale(heard_key, user, abandon_ms, now_ms)
  local heard = tonumber(redis.call('ZSCORE', heard_key, user))
  return heard ~= nil and now_ms - heard > abandon_ms
end
