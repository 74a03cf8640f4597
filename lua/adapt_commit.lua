-- Stores the outcome of a controller step claimed through adapt.lua, unless a later step has
-- been claimed since (a proxy stalled between its two calls): a stale result never overwrites a
-- newer one. After a prelude that binds the names below (declared in src/store/adapt.rs).
--
-- KEYS  adaptive (the adaptive state, see adapt.lua)
-- ARGV  step (its id as adapt.lua returned it), then the new state (see ControlState in
--       src/rules.rs): batch, settle, served_at_cut (0: none), probe_wait
--
-- Returns 1 when stored, 0 when the step was no longer the latest.

if redis.call('HGET', adaptive, 'next') ~= step then
  return 0
end
redis.call('HSET', adaptive, 'batch', batch, 'settle', settle, 'served', served_at_cut, 'wait', probe_wait)
return 1
