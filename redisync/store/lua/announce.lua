-- announce.lua: announce a run's current version if a fold left its announcement owed (a fold inside
-- the run's announce_every_us window does: fold.lua tells its caller when to call this). Any client
-- may pay a debt, and a payment is itself bound by the window: one made before the window since the
-- last announcement has passed announces nothing and says how long is left.
--
-- KEYS[1]   the run's meta hash
-- returns 1 when it announced, 0 when nothing was owed (a later fold announced it already),
--         or {'wait', µs} when the window has not passed yet (the debt stays)
-- (the library's function redisync_announce_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function announce_owed(KEYS, ARGV)
  local m = redis.call('HMGET', KEYS[1], 'announce_owed', 'fleet_version', 'epoch', 'announce_every_us',
    'announced_us')
  if m[1] ~= '1' or not m[3] then return 0 end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local left = (tonumber(m[5]) or 0) + (tonumber(m[4]) or 0) - now
  if left > 0 then return {'wait', string.format('%.0f', left)} end
  redis.call('HSET', KEYS[1], 'announce_owed', '0', 'announced_us', string.format('%.0f', now))
  announce(string.sub(KEYS[1], 1, -5) .. 'versions', m[2] .. ' ' .. m[3])
  return 1
end

export('announce', announce_owed)
