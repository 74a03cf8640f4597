-- The adaptive controller's once-a-second call (admission.adaptive): this proxy reports the
-- protected upstream latencies it saw since its last call, and, when the room's controller step
-- is due (Redis TIME and a stored schedule decide, as for admit.lua), claims that step: it gets
-- every report received since the previous step and the batch in force, and computes the next
-- batch (src/rules.rs, control_step), which adapt_commit.lua stores. However many proxies call,
-- the room steps once a second.
--
-- KEYS[1] the adaptive state (hash: batch = the batch in force; settle, served, wait = the rest
--         of the controller's state, see ControlState in src/rules.rs; next = when the next step
--         is due, in us of Redis TIME)
-- KEYS[2] the latencies reported since the last step (hash: histogram bucket -> count)
-- ARGV[1] the step period (us), ARGV[2] how long the state outlives the last call (ms): a room
--         nobody adapts for that long starts again at batch_size,
-- ARGV[3..] this proxy's report as pairs (bucket, count)
--
-- Returns {0, us until the next step is due}
--       | {1, us until the next step is due, the step's id, batch (-1: none stored), settle,
--          served, wait, bucket, count, bucket, count, ...}

local keep = tonumber(ARGV[2])
for i = 3, #ARGV - 1, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
end
if #ARGV >= 4 then
  redis.call('PEXPIRE', KEYS[2], keep)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = tonumber(ARGV[1])
local due = tonumber(redis.call('HGET', KEYS[1], 'next') or '0')
if now < due then
  return {0, due - now}
end

local next_due = due + period
if next_due <= now then
  next_due = now + period
end
local step = string.format('%.0f', next_due)
redis.call('HSET', KEYS[1], 'next', step)
redis.call('PEXPIRE', KEYS[1], keep)

local state = redis.call('HMGET', KEYS[1], 'batch', 'settle', 'served', 'wait')
local reply = {1, next_due - now, step, tonumber(state[1]) or -1, tonumber(state[2]) or 0,
  tonumber(state[3]) or 0, tonumber(state[4]) or 0}
local reported = redis.call('HGETALL', KEYS[2])
redis.call('DEL', KEYS[2])
for i = 1, #reported do
  reply[#reply + 1] = tonumber(reported[i])
end
return reply
