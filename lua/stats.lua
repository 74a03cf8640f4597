-- The room's numbers for the gauges, read about once a second by every proxy.
-- Expired tokens leave the live-token set here: Redis expires the token keys themselves.
--
-- KEYS[1] the line, KEYS[2] live tokens (see admit.lua)
-- Returns {users waiting, live tokens}

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now_ms))
return {redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2])}
