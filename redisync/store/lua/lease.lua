-- lease.lua: a live process renews (or, at stop, gives up) its lease on a shard id, so that a
-- second process started with the same id is refused (claim.lua) instead of silently taking it,
-- and so that a state key drops the slot of a shard that died (fold.lua).
--
-- KEYS[1]   the run's shards hash;   KEYS[2] the run's meta hash (its served clock, see clock.lua)
-- ARGV[1]   the shard id;   ARGV[2] the caller's incarnation;   ARGV[3] the lease in ms (0: give it up)
-- ARGV[4]   when giving up: why the process stops (lifeline.stop_cause: 'clean', 'parent_exited',
--           'terminated'; absent: 'clean')
-- returns {'leased'} | {'stale', current incarnation}   (a later process claimed the shard)
--
-- lease_ends, gave_up: sorted sets beside the shards hash (keys.py)
-- shards fields: <id>:lease_until_us (server time: claims), <id>:alive_until_us (the served clock:
-- folds; -1 once given up, so a stopped collector leaves a state key at the next fold; <id>:ended_us
-- when, in the served clock, for a history key's retirement), <id>:stopped
-- (why it gave its lease up, while it is given up: an observer tells a crashed trainer from a finish)
-- (the library's function redisync_lease_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

-- A departed shard id leaves the run: once its lease ended (or was given up) longer ago than the
-- run's forget_after_us (register.lua: twice the longest grace of its keys) and no key holds a slot of
-- it any more (each key's fold has dropped or retired it), its fields in the shards hash and its
-- entries in lease_ends and gave_up are deleted, so that the run's memory follows its live fleet, not
-- every id that ever lived. At most two candidates per renewal, taken in turn (trim_offset: one a key
-- still holds is looked at again on the next round).
local SHARD_FIELDS = {'incarnation', 'seq', 'claimed', 'at_us', 'seen', 'made', 'lease_until_us', 'alive_until_us',
  'stopped', 'ended_us'}
local function forget_departed(shards, meta_key, prefix, served, caller)
  -- (HGETs, not an HMGET: see lease() below)
  local forget = tonumber(redis.call('HGET', meta_key, 'forget_after_us'))
  if not forget then return end -- (a run registered before redisync forgot departed ids)
  local offset = tonumber(redis.call('HGET', meta_key, 'trim_offset')) or 0
  local cands = redis.call('ZRANGEBYSCORE', prefix .. 'lease_ends', '-inf', string.format('(%.0f', served - forget),
    'LIMIT', offset, 2)
  local nxt = #cands < 2 and 0 or offset
  local slot_keys = #cands > 0 and redis.call('HGET', meta_key, 'slot_keys')
  for _, id in ipairs(cands) do
    local u = tonumber(redis.call('HGET', shards, id .. ':alive_until_us'))
    local held = id == caller
    if not held and u and u >= 0 and served - u <= forget then
      -- (a lease renewed by an earlier redisync, indexed behind its end: moved to where it stands)
      redis.call('ZADD', prefix .. 'lease_ends', string.format('%.0f', u), id)
      held = true
    end
    if not held then
      for key in string.gmatch(slot_keys or '', '[^\n]+') do
        local writers = redis.call('HGET', prefix .. 'key:' .. key, 'writers')
        if writers and string.find(',' .. writers .. ',', ',' .. id .. ',', 1, true) then held = true break end
      end
    end
    if held then
      nxt = nxt + 1
    else
      local fields = {}
      for j, f in ipairs(SHARD_FIELDS) do fields[j] = id .. ':' .. f end
      redis.call('HDEL', shards, unpack(fields))
      redis.call('ZREM', prefix .. 'lease_ends', id)
      redis.call('ZREM', prefix .. 'gave_up', id)
      redis.call('HINCRBY', meta_key, 'forgotten_ids', 1)
    end
  end
  if nxt ~= offset then redis.call('HSET', meta_key, 'trim_offset', string.format('%d', nxt)) end
end

local function lease(KEYS, ARGV)
  local shard = ARGV[1]
  local cur = redis.call('HGET', KEYS[1], shard .. ':incarnation')
  -- none: the store lost the run's shards (a restart); the caller's next fold records it again
  if cur and cur ~= ARGV[2] then return {'stale', cur} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local ms = tonumber(ARGV[3])
  local until_us = now + 1000 * ms
  local alive = '-1'
  -- (HGETs, not an HMGET: a pull's check is an HMGET, and the server's counts of those tell an
  -- operator, and the tests, whether a quiet collector reads the run)
  local registered = KEYS[2] and redis.call('HGET', KEYS[2], 'epoch')
  local served
  if registered then -- (a registered run: its clock advances)
    local stalled
    served, stalled = served_clock(redis.call('HGET', KEYS[2], 'clock_wall_us'),
      redis.call('HGET', KEYS[2], 'clock_stalled_us'), now, redis.call('HGET', KEYS[2], 'limits'))
    redis.call('HSET', KEYS[2], 'clock_wall_us', string.format('%.0f', now))
    if stalled then redis.call('HSET', KEYS[2], 'clock_stalled_us', stalled) end
    if ms > 0 then alive = string.format('%.0f', served + 1000 * ms) end
  elseif ms > 0 then
    alive = nil
  end
  redis.call('HSET', KEYS[1], shard .. ':lease_until_us', string.format('%.0f', until_us))
  if alive then redis.call('HSET', KEYS[1], shard .. ':alive_until_us', alive) end
  -- the indexes by which a key's fold finds the shards that left without reading every writer:
  -- each lease's end (a give-up's: when it was given up), and each give-up in the order they came
  -- (the run's gave_up_seq)
  if registered then
    local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #'shards')
    if ms > 0 then
      redis.call('ZADD', prefix .. 'lease_ends', alive, shard)
      forget_departed(KEYS[1], KEYS[2], prefix, served, shard)
    else
      local ended = string.format('%.0f', served)
      redis.call('ZADD', prefix .. 'lease_ends', ended, shard)
      redis.call('HSET', KEYS[1], shard .. ':ended_us', ended)
      redis.call('ZADD', prefix .. 'gave_up', redis.call('HINCRBY', KEYS[2], 'gave_up_seq', 1), shard)
    end
  end
  if ms > 0 then
    redis.call('HDEL', KEYS[1], shard .. ':stopped')
  else
    redis.call('HSET', KEYS[1], shard .. ':stopped', ARGV[4] or 'clean')
  end
  return {'leased'}
end

export('lease', lease)
