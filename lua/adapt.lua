-- The adaptive controller's once-a-second call (admission.adaptive): this proxy reports the
-- protected upstream latencies it saw since its last call, and, when the room's controller step
-- is due (Redis TIME and a stored schedule decide, as for admit.lua), claims that step: it gets
-- every report received since the previous step and the batch in force, and computes the next
-- batch (src/rules.rs, control_step), which adapt_commit.lua stores. However many proxies call,
-- the room steps once a second. After a prelude that binds the names below (declared in
-- src/store/adapt.rs).
--
-- KEYS
--   adaptive   the adaptive state (hash: batch = the batch in force; settle, served, wait = the
--              rest of the controller's state, see ControlState in src/rules.rs; next = when the
--              next step is due, in us of Redis TIME)
--   latencies  the latencies reported since the last step (hash: histogram bucket -> count)
-- ARGV
--   period_us  the step period
--   keep_ms    how long the state outlives the last call: a room nobody adapts for that long
--              starts again at batch_size
--   judged     of this proxy's latencies, how many it judged against the room's target_p95...
--   over       ... and how many of those were above it (kept beside the state, as the fields
--              judged and over: the histogram's hash holds numbered buckets only)
--   from ARGV[REST], this proxy's report as pairs (bucket, count)
--
-- Reply, in the order src/store/adapt.rs declares it (AdaptReply): claimed (1: this call claimed
-- the step), wait_us (until the next step is due); a claimed step adds step (its id), batch (-1:
-- none before the first commit), settle, served_at_cut, probe_wait, latencies (every report
-- since the previous step, as one array of pairs bucket, count), judged and over (their sums).

for i = REST, #ARGV - 1, 2 do
  redis.call('HINCRBY', latencies, ARGV[i], ARGV[i + 1])
end
if #ARGV > REST then
  redis.call('PEXPIRE', latencies, keep_ms)
end
-- A new state hash these create has no expiry yet; it is claimed below at once (no 'next'), and
-- the claim sets it.
if tonumber(judged) > 0 then
  redis.call('HINCRBY', adaptive, 'judged', judged)
  redis.call('HINCRBY', adaptive, 'over', over)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = tonumber(period_us)
local due = tonumber(redis.call('HGET', adaptive, 'next') or '0')
if now < due then
  return {0, due - now}
end

local next_due = due + period
if next_due <= now then
  next_due = now + period
end
local step = string.format('%.0f', next_due)
redis.call('HSET', adaptive, 'next', step)
redis.call('PEXPIRE', adaptive, keep_ms)

local state = redis.call('HMGET', adaptive, 'batch', 'settle', 'served', 'wait', 'judged', 'over')
redis.call('HDEL', adaptive, 'judged', 'over')
local reported = redis.call('HGETALL', latencies)
redis.call('DEL', latencies)
return {1, next_due - now, step, tonumber(state[1]) or -1, tonumber(state[2]) or 0, tonumber(state[3]) or 0,
  tonumber(state[4]) or 0, reported, tonumber(state[5]) or 0, tonumber(state[6]) or 0}
