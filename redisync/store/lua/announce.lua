-- announce.lua: announce a run's current version if a fold left its announcement owed (a fold inside
-- the run's announce_every_us window does: fold.lua tells its caller when to call this).
--
-- KEYS[1]   the run's meta hash
-- returns 1 when it announced, 0 when nothing was owed (a later fold announced it already)
-- (the library's function redisync_announce_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function announce_owed(KEYS, ARGV)
  local m = redis.call('HMGET', KEYS[1], 'announce_owed', 'fleet_version', 'epoch')
  if m[1] ~= '1' or not m[3] then return 0 end
  local t = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'announce_owed', '0', 'announced_us', t[1] .. string.sub('00000' .. t[2], -6))
  announce(string.sub(KEYS[1], 1, -5) .. 'versions', m[2] .. ' ' .. m[3])
  return 1
end

export('announce', announce_owed)
