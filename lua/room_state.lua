-- Shared by admit.lua, enter.lua and room.lua: placed after their generated prelude when the
-- binary is built (src/store/script.rs). Everything a helper needs comes as a parameter.
--
-- The room's state (contract section 15, src/control.rs): open, paused or closed, one hash under
-- the room's prefix. Admission and the line read it inside their own atomic step, so a pause or a
-- close holds from the very next call of every proxy, whatever that proxy has heard of it yet.
-- A room that never had a state (or whose Redis lost it) is open.

local function room_state_of(room_key)
  return redis.call('HGET', room_key, 'state') or 'open'
end

-- Admissions of the last minute, for the operator (GET /admin/room): a ring of one slot per
-- second, so the key stays at 120 fields however long the room runs and nothing has to prune it.
-- Slot i holds s<i> (the second it counts) and n<i> (admissions in that second).
local MINUTE_SLOTS = 60

local function count_admitted(ring_key, n, now_ms)
  if n <= 0 then return end
  local second = math.floor(now_ms / 1000)
  local slot = tostring(second % MINUTE_SLOTS)
  local at = string.format('%.0f', second)
  if redis.call('HGET', ring_key, 's' .. slot) == at then
    redis.call('HINCRBY', ring_key, 'n' .. slot, n)
  else
    redis.call('HSET', ring_key, 's' .. slot, at, 'n' .. slot, n)
  end
end

local function admitted_last_minute(ring_key, now_ms)
  local second = math.floor(now_ms / 1000)
  local ring = redis.call('HGETALL', ring_key)
  local fields = {}
  for i = 1, #ring, 2 do
    fields[ring[i]] = ring[i + 1]
  end
  local total = 0
  for slot = 0, MINUTE_SLOTS - 1 do
    local at = tonumber(fields['s' .. slot])
    if at and second - at < MINUTE_SLOTS then
      total = total + (tonumber(fields['n' .. slot]) or 0)
    end
  end
  return total
end
