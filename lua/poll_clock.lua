-- Shared by enter.lua and status.lua: placed after their generated prelude when the binary is
-- built (src/store/script.rs).
--
-- Server-enforced polling (contract section 9). An answer that tells a waiting user to poll
-- again in pollAfter seconds starts that user's clock: a status call before
-- pollAfter * (1 - grace) has passed is refused. The proxy hands the rules over as data, so the
-- arithmetic lives in one place (src/rules.rs). Needs from the script's prelude:
--   poll_factor       1 - grace, or 0 when enforcement is off (as text, like every number)
--   ARGV[REST..]      pairs (first position of a tier, pollAfter in ms), in tier order
-- and, placed before it, lua/room_clock.lua: right after an outage the clock neither starts nor
-- refuses (`after_outage`).

-- Numbers are converted once a call, when first needed: `tonumber` costs about a thousand
-- instructions, and a group of enters asks for the same ones once a member.
local factor = tonumber(poll_factor)
local tiers = {}

local function tier_number(i)
  local n = tiers[i]
  if n == nil then
    n = tonumber(ARGV[i])
    tiers[i] = n
  end
  return n
end

local function poll_after_ms(position)
  for i = REST, #ARGV - 1, 2 do
    if position >= tier_number(i) then
      return tier_number(i + 1)
    end
  end
  return nil
end

local function enforcing()
  return factor > 0
end

-- Whether a status call now would be refused: before the time its clock says.
local function too_early(on_time, now)
  return on_time ~= nil and now < on_time and not after_outage
end

-- Redis's time in ms, read once a call: a call is one moment, for every member of a group.
local call_now_ms = nil

local function now_ms()
  if not call_now_ms then
    local t = redis.call('TIME')
    call_now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return call_now_ms
end

-- An answer with a pollAfter was just given: the next status call is on time from then on.
local function start_poll_clock(key, position)
  if not enforcing() or after_outage then return end
  local ms = poll_after_ms(position)
  if not ms then return end
  local on_time = now_ms() + math.floor(ms * factor)
  -- The record outlives the wait it enforces, then goes by itself.
  redis.call('SET', key, string.format('%.0f', on_time), 'PX', ms * 2 + 1000)
end

-- A null pollAfter (READY, NOT_IN_QUEUE) enforces nothing.
local function stop_poll_clock(key)
  if enforcing() then redis.call('DEL', key) end
end
