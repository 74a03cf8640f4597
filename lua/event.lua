-- A scheduled event (contract section 14): its phase by Redis's clock, and each step that
-- happens once for the whole room (the seed, the draw, the close), done by whichever proxy's call
-- comes first. Built after a prelude that binds the names below (declared in
-- src/store/event.rs).
--
-- KEYS
--   event       hash: seed (hex), sha (SHA-256 of the seed's bytes, hex), drawn (users drawn,
--               set once at the opening), closed (Redis ms of the close, set once)
--   event_draw  the draw list (sorted set, member = a pre-queued user's HMAC hex, score = the
--               user's score in the line): what {prefix}/event/draw publishes
--   queue, seq  the line and its arrival counter (as in enter.lua)
--   user_token  the entering user's token (a tick reads none)
--   address_counter  the identities the client address brought in this minute (as in enter.lua)
-- ARGV
--   op          'tick' (read the event, doing what its time calls for) or 'enter'
--   user, opens_ms, prequeue_ms (when the pre-queue opens), closes_ms (0 = never): Unix ms
--   capacity, shuffle (1: pre-queue in HMAC order, 0: arrival order)
--   seed, seed_sha   tick: a fresh candidate, kept only if the room has none; enter: the seed
--                    the proxy computed the HMAC with
--   hmac        enter: HMAC-SHA256(seed, user), hex
--   per_address identities per address per minute (0 = no limit), as in enter.lua
--
-- Replies: a tag, then its fields in the order src/store/event.rs declares them (EventReply):
--   TICK       now_ms, seed, drawn (nil before the draw), prequeued, did_draw, did_close,
--              closed (1 once the close happened)
--   NOT_OPEN   opens_in_ms                    (before the pre-queue: nobody is queued)
--   PREQUEUED  opens_in_ms, already (1: was in the pre-queue already)
--   FULL       (the pre-queue took the line's capacity)
--   LIMITED    retry_secs                     (a new identity over the address's limit)
--   CLOSED
--   READY      token, remaining_ms            (the user holds a live token, any phase)
--   OPEN       (the event is open: the proxy enters the user with enter.lua)
--   SEED       seed                           (the room's seed is another one: hash again)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
opens_ms = tonumber(opens_ms)
prequeue_ms = tonumber(prequeue_ms)
closes_ms = tonumber(closes_ms)

-- The seed is chosen when the pre-queue opens, before anyone can enter it: its hash is public
-- from then on, and nobody (proxy or operator) can pick it after seeing who entered.
local function choose_seed()
  if redis.call('HSETNX', event, 'seed', seed) == 1 then
    redis.call('HSET', event, 'sha', seed_sha)
  end
end

-- The draw: nothing moves. Pre-queued users are already at the front of the line in drawn
-- order (their scores sit below every arrival number); from the opening no one else joins the
-- pre-queue and admission runs. What is recorded, once, is how many were drawn.
local function draw()
  choose_seed()
  return redis.call('HSETNX', event, 'drawn', redis.call('ZCARD', event_draw))
end

-- The close ends the line: waiting users lose their places (their status answers CLOSED),
-- tokens already issued are separate keys and live on. UNLINK frees a long line off Redis's
-- main thread.
local function close()
  if redis.call('HSETNX', event, 'closed', now) == 1 then
    redis.call('UNLINK', queue)
    return 1
  end
  return 0
end

-- What happened stays happened: a reload (or a restart) that moves the times after the draw or
-- the close cannot reopen the pre-queue, let newcomers in among the drawn, or reopen the line.
local happened = redis.call('HMGET', event, 'drawn', 'closed')
local open = happened[1] ~= false or now >= opens_ms
local closed = happened[2] ~= false or (closes_ms > 0 and now >= closes_ms)

if op == 'tick' then
  if now >= prequeue_ms then choose_seed() end
  local did_draw = 0
  if open then did_draw = draw() end
  local did_close = 0
  if closed then did_close = close() end
  local state = redis.call('HMGET', event, 'seed', 'drawn', 'closed')
  local was_closed = 0
  if state[3] then was_closed = 1 end
  return {'TICK', now, state[1], state[2], redis.call('ZCARD', event_draw), did_draw, did_close, was_closed}
end

local held = redis.call('GET', user_token)
if held then
  return {'READY', held, redis.call('PTTL', user_token)}
end
if closed then
  if open then draw() end
  close()
  return {'CLOSED'}
end
if now < prequeue_ms then
  return {'NOT_OPEN', opens_ms - now}
end
if open then
  draw()
  return {'OPEN'}
end

choose_seed()
local stored = redis.call('HGET', event, 'sha')
if stored ~= seed_sha then
  return {'SEED', redis.call('HGET', event, 'seed')}
end
if redis.call('ZSCORE', queue, user) then
  return {'PREQUEUED', opens_ms - now, 1}
end
-- The per-address limit of enter.lua (section 9), the same rule: a pre-queue is an enter, and
-- without it one address could hold many draws.
local limit = tonumber(per_address)
if limit > 0 then
  local window = math.floor(now / 60000)
  redis.call('ZREMRANGEBYSCORE', address_counter, '-inf', '(' .. string.format('%.0f', window))
  if not redis.call('ZSCORE', address_counter, user) then
    if redis.call('ZCARD', address_counter) >= limit then
      return {'LIMITED', math.max(1, math.ceil(((window + 1) * 60000 - now) / 1000))}
    end
    redis.call('ZADD', address_counter, string.format('%.0f', window), user)
    redis.call('EXPIRE', address_counter, 120)
  end
end
if redis.call('ZCARD', queue) >= tonumber(capacity) then
  return {'FULL'}
end
local score
if shuffle then
  -- The HMAC's first 52 bits as a fraction: exact in a double, below every arrival number.
  score = tonumber(string.sub(hmac, 1, 13), 16) / 4503599627370496
else
  score = redis.call('INCR', seq)
end
redis.call('ZADD', queue, 'NX', score, user)
redis.call('ZADD', event_draw, score, hmac)
return {'PREQUEUED', opens_ms - now, 0}
