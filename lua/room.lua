-- The operator's view of the room, and the commands that change its state (contract section 15):
-- one atomic step, so the answer to a command is the room as that command left it.
-- Built after a prelude that binds the names below (declared in src/store/room.rs) and after
-- lua/room_state.lua.
--
-- KEYS
--   room             the room's state (hash: state, since, by; see room_state.lua)
--   queue, heard     the line and its heard-from times (see admit.lua)
--   tokens           live tokens (sorted set, score = expiry in ms)
--   adaptive         the adaptive controller's state (the stored batch)
--   admitted_minute  admissions per second of the last minute (see room_state.lua)
-- ARGV
--   command          '' (only look), pause, resume, close or open
--   by               who asks (admin, origin, event), stored with a change
--   read_batch       read the adaptive controller's stored batch
--
-- Transitions: pause (open -> paused), resume (paused -> open), close (any -> closed: the line
-- is emptied, every waiting user loses the place; tokens stay), open (closed -> open with a new,
-- empty line; paused -> open). A command that asks for the state the room is in changes nothing.
-- pause and resume refuse a closed room: a resumed sold-out sale would be a mistake, and only
-- open reopens it.
--
-- Reply, in the order src/store/room.rs declares it (RoomReply): state, before (the state before
-- this call), refused ('' or why the command was refused), since_ms (-1: never changed),
-- waiting, live_tokens, stored_batch (-1: none stored or not asked), admitted_last_minute.

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local before = room_state_of(room)
local after = before
local refused = ''

local function empty_line()
  redis.call('DEL', queue, heard)
end

if command == 'pause' or command == 'resume' then
  if before == 'closed' then
    refused = 'the room is closed; only open reopens it'
  else
    after = (command == 'pause') and 'paused' or 'open'
  end
elseif command == 'close' then
  after = 'closed'
  empty_line()
elseif command == 'open' then
  after = 'open'
  if before == 'closed' then
    empty_line()
  end
end

if after ~= before then
  redis.call('HSET', room, 'state', after, 'since', string.format('%.0f', now_ms), 'by', by)
end

redis.call('ZREMRANGEBYSCORE', tokens, '-inf', string.format('%.0f', now_ms))
local stored_batch = -1
if read_batch then
  stored_batch = tonumber(redis.call('HGET', adaptive, 'batch')) or -1
end
return {after, before, refused, tonumber(redis.call('HGET', room, 'since')) or -1,
  redis.call('ZCARD', queue), redis.call('ZCARD', tokens), stored_batch,
  admitted_last_minute(admitted_minute, now_ms)}
