-- Shared by admit.lua, enter.lua and status.lua: placed after their generated prelude (and
-- before lua/poll_clock.lua, which reads `after_outage`) when the binary is built
-- (src/store/script.rs). Needs the key `room_clock` (a hash: real = Redis ms at the last call
-- that kept time, room = the room's ms then, resumed = Redis ms when the last outage ended).
--
-- The room's clock: Redis's own, with the outages taken out (contract section 5: time during
-- which Redis was unreachable never counts against a waiting user). Abandonment reads it.
-- While abandonment or enforced polling is on, every call that keeps time advances it by the
-- time since the one before: each proxy's admission ticker makes such a call at least every
-- 250 ms, and every enter and status does. A pause longer than OUTAGE_MS in which no call
-- reached Redis means nothing could: Redis was frozen, restarting or cut off, or no proxy ran.
-- Such a pause is not counted, and the room clock stops for it.
--
-- Calls queued while Redis was frozen run the moment it is back, for proxies that have long
-- answered 503 instead: what they answer now reaches nobody. So for OUTAGE_MS after an outage
-- the poll clock neither starts nor refuses (`after_outage`), and a user's answer never sent
-- cannot make their next poll too early.

local OUTAGE_MS = 1000
local after_outage = false

-- The room's time in ms; advances the clock (see above).
local function room_time()
  local t = redis.call('TIME')
  local real = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local clock = redis.call('HMGET', room_clock, 'real', 'room', 'resumed')
  local last, room, resumed = tonumber(clock[1]), tonumber(clock[2]), tonumber(clock[3]) or 0
  if not last or not room then
    -- A new room: its clock starts at Redis's.
    room = real
  elseif real - last > OUTAGE_MS or real < last then
    -- An outage (or Redis's clock went back: a failover to another host): not counted.
    resumed = real
  else
    room = room + (real - last)
  end
  redis.call('HSET', room_clock, 'real', string.format('%.0f', real),
    'room', string.format('%.0f', room), 'resumed', string.format('%.0f', resumed))
  after_outage = resumed > 0 and real - resumed < OUTAGE_MS
  return room
end
