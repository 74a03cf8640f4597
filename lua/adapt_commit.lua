-- Stores the outcome of a controller step claimed through adapt.lua, unless a later step has
-- been claimed since (a proxy stalled between its two calls): a stale result never overwrites a
-- newer one.
--
-- KEYS[1] the adaptive state (see adapt.lua)
-- ARGV[1] the step's id as adapt.lua returned it, ARGV[2] the new batch, ARGV[3] settle,
-- ARGV[4] served (0: none), ARGV[5] wait (see ControlState in src/rules.rs)
--
-- Returns 1 when stored, 0 when the step was no longer the latest.

if redis.call('HGET', KEYS[1], 'next') ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'batch', ARGV[2], 'settle', ARGV[3], 'served', ARGV[4], 'wait', ARGV[5])
return 1
