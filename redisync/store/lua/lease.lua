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
-- folds; -1 once given up, so a stopped collector leaves a state key at the next fold), <id>:stopped
-- (why it gave its lease up, while it is given up: an observer tells a crashed trainer from a finish)
-- (the library's function redisync_lease_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

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
  if registered then -- (a registered run: its clock advances)
    local served, stalled = served_clock(redis.call('HGET', KEYS[2], 'clock_wall_us'),
      redis.call('HGET', KEYS[2], 'clock_stalled_us'), now, redis.call('HGET', KEYS[2], 'limits'))
    redis.call('HSET', KEYS[2], 'clock_wall_us', string.format('%.0f', now))
    if stalled then redis.call('HSET', KEYS[2], 'clock_stalled_us', stalled) end
    if ms > 0 then alive = string.format('%.0f', served + 1000 * ms) end
  elseif ms > 0 then
    alive = nil
  end
  redis.call('HSET', KEYS[1], shard .. ':lease_until_us', string.format('%.0f', until_us))
  if alive then redis.call('HSET', KEYS[1], shard .. ':alive_until_us', alive) end
  -- the indexes by which a state key's fold finds the shards that left without reading every writer:
  -- each lease's end, and each give-up in the order they came (the run's gave_up_seq)
  if registered then
    local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #'shards')
    if ms > 0 then
      redis.call('ZADD', prefix .. 'lease_ends', alive, shard)
    else
      redis.call('ZREM', prefix .. 'lease_ends', shard)
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
