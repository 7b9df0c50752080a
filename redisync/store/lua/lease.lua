-- lease.lua: a live process renews (or, at stop, gives up) its lease on a shard id, so that a
-- second process started with the same id is refused (claim.lua) instead of silently taking it.
--
-- KEYS[1]   the run's shards hash
-- ARGV[1]   the shard id;   ARGV[2] the caller's incarnation;   ARGV[3] the lease in ms (0: give it up)
-- returns {'leased'} | {'stale', current incarnation}   (a later process claimed the shard)
-- (the library's function redisync_lease_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function lease(KEYS, ARGV)
  local shard = ARGV[1]
  local cur = redis.call('HGET', KEYS[1], shard .. ':incarnation')
  -- none: the store lost the run's shards (a restart); the caller's next fold records it again
  if cur and cur ~= ARGV[2] then return {'stale', cur} end
  local t = redis.call('TIME')
  local until_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + 1000 * tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], shard .. ':lease_until_us', string.format('%.0f', until_us))
  return {'leased'}
end

export('lease', lease)
