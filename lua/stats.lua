-- The room's numbers for the gauges and for the estimates enter and status give, read about four
-- times a second by every proxy (the room watcher).
-- Expired tokens leave the live-token set here: Redis expires the token keys themselves.
--
-- After a prelude that binds the names below (declared in src/store/stats.rs).
--
-- KEYS  queue (the line), tokens (live tokens), adaptive (the adaptive state, see adapt.lua),
--       admissions (the admissions log, see record_admissions in admission.lua), room (the
--       room's state, see room_state.lua: read here so that following it costs no call of its own)
-- ARGV  read_batch (read the adaptive batch), read_admissions (read the measured admissions);
--       neither: the two numbers of the fixed rate only
--
-- Reply, in the order src/store/stats.rs declares it (StatsReply): waiting (users waiting),
-- live_tokens, stored_batch (-1: none stored or not asked), admitted_recently (users admitted in
-- the last 10 s), since_first_ms (ms since the room's first admission; -1: none yet or not asked),
-- state (open, paused or closed), state_since_ms (when it last changed, Redis's clock; -1: never)

local WINDOW_MS = 10000
local LOG_BUCKET_MS = 100

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', tokens, '-inf', string.format('%.0f', now_ms))
local stored_batch, admitted_recently, since_first_ms = -1, 0, -1

if read_batch then
  stored_batch = tonumber(redis.call('HGET', adaptive, 'batch')) or -1
end

if read_admissions then
  local log = redis.call('HGETALL', admissions)
  local old = {}
  for i = 1, #log, 2 do
    if log[i] == 'first' then
      since_first_ms = math.max(0, now_ms - tonumber(log[i + 1]))
    else
      -- A bucket counts while any of its 100 ms lies in the window; older ones go.
      local ends = (tonumber(log[i]) + 1) * LOG_BUCKET_MS
      if ends > now_ms - WINDOW_MS then
        admitted_recently = admitted_recently + tonumber(log[i + 1])
      else
        old[#old + 1] = log[i]
      end
    end
  end
  if #old > 0 then
    redis.call('HDEL', admissions, unpack(old))
  end
end

return {redis.call('ZCARD', queue), redis.call('ZCARD', tokens), stored_batch, admitted_recently,
  since_first_ms, room_state_of(room), tonumber(redis.call('HGET', room, 'since')) or -1}
