-- The room's numbers for the gauges and for the estimates enter and status give, read about four
-- times a second by every proxy (the room watcher).
-- Expired tokens leave the live-token set here: Redis expires the token keys themselves.
--
-- KEYS[1] the line, KEYS[2] live tokens, KEYS[3] the adaptive state (see adapt.lua),
-- KEYS[4] the admissions log (see record_admissions in admission.lua)
-- ARGV[1] 1 = read the adaptive batch, ARGV[2] 1 = read the measured admissions
-- (both absent or 0: the two numbers of the fixed rate only)
--
-- Returns {users waiting, live tokens, the stored batch (-1: none or not asked),
--          users admitted in the last 10 s, ms since the room's first admission (-1: none or
--          not asked)}

local WINDOW_MS = 10000
local LOG_BUCKET_MS = 100

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now_ms))
local reply = {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]), -1, 0, -1}

if ARGV[1] == '1' then
  reply[3] = tonumber(redis.call('HGET', KEYS[3], 'batch')) or -1
end

if ARGV[2] == '1' then
  local log = redis.call('HGETALL', KEYS[4])
  local old = {}
  for i = 1, #log, 2 do
    if log[i] == 'first' then
      reply[5] = math.max(0, now_ms - tonumber(log[i + 1]))
    else
      -- A bucket counts while any of its 100 ms lies in the window; older ones go.
      local ends = (tonumber(log[i]) + 1) * LOG_BUCKET_MS
      if ends > now_ms - WINDOW_MS then
        reply[4] = reply[4] + tonumber(log[i + 1])
      else
        old[#old + 1] = log[i]
      end
    end
  end
  if #old > 0 then
    redis.call('HDEL', KEYS[4], unpack(old))
  end
end

return reply
