-- Enter the line: one atomic step, so no burst of concurrent enters can exceed the capacity,
-- share a number, or hold two places for one user. One call carries a group of enters (the
-- members), taken in their order, each exactly as if it had been a call of its own: a member sees
-- everything the members before it did. Built after a prelude that binds the names below
-- (declared in src/store/enter.rs) and after lua/room_clock.lua, lua/poll_clock.lua,
-- lua/admission.lua and lua/room_state.lua.
--
-- KEYS
--   queue            the line (sorted set, member = user, score = arrival number)
--   seq              the arrival counter
--   tokens, next_admission, admission_spent, adaptive, admissions, heard
--                    live tokens, the admission schedule, the interval's spent budget, the
--                    adaptive state, the admissions log, heard-from times (in the room's time,
--                    as in admit.lua)
--   epoch            the room's epoch (see src/line.rs)
--   room, admitted_minute
--                    the room's state and the minute of admissions (see room_state.lua)
--   room_clock       the room's clock, which abandonment reads (see room_clock.lua)
--   then, from KEYS[KEYS_REST], per member:
--   user_token       the member's token
--   user_clock       the member's poll clock (see poll_clock.lua), only when polls are enforced
--   address_counter  the identities the member's client address brought in (sorted set,
--                    score = the minute, in Redis time, that counted each), only with a
--                    per-address limit
--   (a key the call's switches leave unused is not sent: each costs Redis a Lua string)
-- ARGV
--   capacity, per_address (identities per address per minute, 0 = no limit),
--   abandon_ms (0 = off),
--   ttl_ms, interval_us, batch_size, min_batch (0 = not adaptive), max_active (0 = no cap),
--   listens          log admissions for the measured rate,
--   instant          admission.instant: members carry a token for an instant pass,
--   poll_factor, members (how many),
--   then, from ARGV[REST], per member:
--   user             the member's id
--   instant_token    the token to issue if the member may pass at once, only when instant
--   and after the members, the poll clock's tiers.
--
-- Reply: one flat array: the room's epoch (nil before the first seed), then each member's
-- reply in their order, a tag and its fields in the order src/store/enter.rs declares them
-- (EnterReply), where abandoned (0 or 1) says this enter found the user's place lost and
-- removed it:
--   READY    token, remaining_ms, instant (1: an instant pass given now), abandoned
--   WAITING  position, already (1: was waiting), abandoned, arrival (the user's number)
--   FULL     abandoned
--   LIMITED  retry_secs (until the address's window ends), abandoned
--   CLOSED   (nothing: the room is closed, contract section 15)
-- Flat rather than a table a member: Redis checks every table of a reply for its special fields
-- (err, ok, double, map...) before reading it as an array, and the proxy parses one array less.
-- Numbers arrive as text (see src/store/script.rs): each is converted on the paths that use it.

-- What every member shares: read once for the group.
abandon_ms = tonumber(abandon_ms)
local room_now = nil
if abandon_ms > 0 or enforcing() then
  room_now = room_time()
end
-- A closed room takes nobody new (READY users keep their tokens); a paused one still queues,
-- but gives no instant pass (see room_state.lua).
local room_state = room_state_of(room)
local limit = tonumber(per_address)
-- Nothing here sets the epoch: one read serves every member.
local room_epoch = redis.call('GET', epoch)
-- The line's length, read once a call and kept as members join it or lose their place: only
-- this script changes the line while it runs. (Two ZCARDs a new member, otherwise.)
local line_length = nil
local function queue_length()
  if not line_length then line_length = redis.call('ZCARD', queue) end
  return line_length
end
local capacity_number = nil

-- Arrival numbers: the group's first new place takes its number with INCR; the places after it
-- count on from there, and the counter is raised once, at the end, by as many. Each place gets
-- exactly the number an INCR of its own would have given, and the counter ends where those INCRs
-- would have left it: one write of the counter a group instead of one a new place (a quarter of
-- a new user's commands here). Nothing else runs between. A script stopped by an error keeps
-- what it wrote before it, so the members run under pcall and the counter is raised before the
-- error goes on: a number in the line is never one the counter gives again.
local last_number = nil
local counted = 0
local function take_number()
  if last_number then
    last_number = last_number + 1
    counted = counted + 1
  else
    last_number = redis.call('INCR', seq)
  end
  return last_number
end

-- New places are written with one ZADD at the end of the call, not one a member: a call from
-- the script costs Redis more than the place itself. Every pending place is new (nobody in the
-- line has its user) and has a larger number than any place in the line, so no rank a member
-- reads in between moves for it; a member whose user came earlier in the same call writes them
-- first (see `seen` below).
local pending = {}
local pending_n = 0
local function write_places()
  if pending_n > 0 then
    redis.call('ZADD', queue, 'NX', unpack(pending, 1, pending_n))
    pending_n = 0
  end
end

-- The instant pass: nobody waits and the interval in progress has room left. It is an
-- admission like the tick's: it spends the same interval's batch in force and respects
-- max_active, so the room never admits more than its batch per interval.
local function instant_pass(user, user_token, instant_token)
  if queue_length() > 0 then return false end
  local now = redis_now_us()
  local ms = math.floor(now / 1000)
  local due = tonumber(redis.call('GET', next_admission) or '0')
  local next_due = due
  local spent = 0
  if now >= due then
    -- The tick that opens the next interval is due but has not run; with nobody waiting it
    -- would admit no one, so open that interval here, exactly as it would have.
    next_due = next_tick(due, now, tonumber(interval_us))
  else
    local budget = redis.call('HMGET', admission_spent, 'due', 'count')
    if tonumber(budget[1]) == due then spent = tonumber(budget[2]) or 0 end
  end
  if spent >= batch_in_force(adaptive, tonumber(batch_size), tonumber(min_batch)) then return false end
  if room_under_cap(tokens, tonumber(max_active), ms) < 1 then return false end
  if next_due ~= due then
    redis.call('SET', next_admission, int_text(next_due))
  end
  redis.call('HSET', admission_spent, 'due', int_text(next_due), 'count', spent + 1)
  issue_token(user_token, tokens, user, instant_token, tonumber(ttl_ms), ms)
  if listens then record_admissions(admissions, 1, ms) end
  count_admitted(admitted_minute, 1, ms)
  return true
end

-- `held` and `score` are the member's token and arrival number as Redis holds them now (false
-- for none).
local function enter(user, instant_token, user_token, user_clock, address_counter, held, score)
  if held then
    stop_poll_clock(user_clock)
    return 'READY', held, redis.call('PTTL', user_token), 0, 0
  end

  if room_state == 'closed' then
    return 'CLOSED'
  end

  local abandoned = 0
  local rank = score and redis.call('ZRANK', queue, user)
  if rank and abandon_ms > 0 then
    if is_stale(heard, user, abandon_ms, room_now) then
      -- Not heard from for too long: the place is lost, and this enter queues at the back.
      line_length = queue_length() - 1
      redis.call('ZREM', queue, user)
      abandoned = 1
      rank = nil
    else
      redis.call('ZADD', heard, int_text(room_now), user)
    end
  end
  if rank then
    start_poll_clock(user_clock, rank + 1)
    return 'WAITING', rank + 1, 1, 0, tonumber(score)
  end

  -- Hoarding places with many identities from one address: only new places are limited. The
  -- count is per minute of Redis's clock; the minute is the score, not part of the key's name,
  -- so the one key is declared (KEYS) and the last minute's entries simply go.
  if limit > 0 then
    local now = now_ms()
    local window = math.floor(now / 60000)
    redis.call('ZREMRANGEBYSCORE', address_counter, '-inf', '(' .. int_text(window))
    if not redis.call('ZSCORE', address_counter, user) then
      if redis.call('ZCARD', address_counter) >= limit then
        return 'LIMITED', math.max(1, math.ceil(((window + 1) * 60000 - now) / 1000)), abandoned
      end
      redis.call('ZADD', address_counter, int_text(window), user)
      redis.call('EXPIRE', address_counter, 120)
    end
  end

  if instant_token and room_state == 'open' and instant_pass(user, user_token, instant_token) then
    stop_poll_clock(user_clock)
    return 'READY', instant_token, redis.call('PTTL', user_token), 1, abandoned
  end

  capacity_number = capacity_number or tonumber(capacity)
  if queue_length() >= capacity_number then
    return 'FULL', abandoned
  end

  -- The score is Redis's own counter, never a server clock: arrival order at Redis is the order.
  local number = take_number()
  -- As text: Redis writes a number argument with snprintf's %.17g (about 3.7k instructions,
  -- callgrind; string.format's integer 2.9k).
  pending[pending_n + 1] = string.format('%d', number)
  pending[pending_n + 2] = user
  pending_n = pending_n + 2
  if abandon_ms > 0 then
    redis.call('ZADD', heard, int_text(room_now), user)
  end
  -- The newest number is the largest, so the new place is the last one.
  line_length = queue_length() + 1
  local position = line_length
  start_poll_clock(user_clock, position)
  return 'WAITING', position, 0, abandoned, number
end

-- The members' arguments open the tail; the poll clock's tiers follow them, so the tail the
-- poll clock reads starts past the members.
local n = tonumber(members)
local first_arg = REST
local args_each = instant and 2 or 1
REST = REST + args_each * n
local clocks = enforcing()
local keys_each = 1 + (clocks and 1 or 0) + (limit > 0 and 1 or 0)
-- Globals read through Redis's protected environment: once, not once a member.
local argv, keys = ARGV, KEYS

-- What every member finds before the group changes anything, with one call each: the tokens
-- (MGET) and the arrival numbers (ZMSCORE). A member sees what the members before it did,
-- so a user who came earlier in the same call reads again, after the pending places.
local users, token_keys = {}, {}
for i = 1, n do
  users[i] = argv[first_arg + args_each * (i - 1)]
  token_keys[i] = keys[KEYS_REST + keys_each * (i - 1)]
end
local held_tokens = redis.call('MGET', unpack(token_keys, 1, n))
local scores = redis.call('ZMSCORE', queue, unpack(users, 1, n))
-- Users already entered in this call.
local seen = {}

-- The reply, written as the members answer: a member's tag and fields, which are never nil.
local out, out_n = {room_epoch}, 1
local function answer(tag, a, b, c, d)
  out[out_n + 1] = tag
  out_n = out_n + 1
  if a == nil then return end
  out[out_n + 1], out[out_n + 2] = a, b
  out_n = out_n + (b == nil and 1 or 2)
  if c == nil then return end
  out[out_n + 1], out[out_n + 2] = c, d
  out_n = out_n + (d == nil and 1 or 2)
end

local ok, failure = pcall(function()
  for i = 1, n do
    local user = users[i]
    local k = KEYS_REST + keys_each * (i - 1) + 1
    local user_clock, address_counter, instant_token = nil, nil, nil
    if clocks then
      user_clock, k = keys[k], k + 1
    end
    if limit > 0 then address_counter = keys[k] end
    if instant then instant_token = argv[first_arg + args_each * (i - 1) + 1] end
    local held, score = held_tokens[i], scores[i]
    if seen[user] then
      write_places()
      held = redis.call('GET', token_keys[i])
      score = redis.call('ZSCORE', queue, user)
    end
    seen[user] = true
    answer(enter(user, instant_token, token_keys[i], user_clock, address_counter, held, score))
  end
end)
if counted > 0 then redis.call('INCRBY', seq, counted) end
write_places()
if not ok then error(failure) end
return out
