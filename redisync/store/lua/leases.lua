-- leases.lua: what an observer (inspect, watch, the exporter) reads of a run's leases, judged by the
-- fold's own served clock (clock.lua's served_clock), without advancing it. Read-only.
--
-- KEYS[1]   the run's shards hash;   KEYS[2] the run's meta hash
-- returns {'no_run'}
--       | {'leases', now_us, served_us, clock_wall_us ('' before the run's first call), stall_cap_us,
--          then per shard that holds or held a lease: shard id, alive_until_us (-1: given up),
--          why it gave the lease up ('' while it holds one: lease.lua's <id>:stopped)}
-- (the library's function redisync_leases_<version>, see library.py: KEYS and ARGV are the FCALL_RO's keys and arguments)

local function leases(KEYS, ARGV)
  local meta = redis.call('HMGET', KEYS[2], 'epoch', 'clock_wall_us', 'clock_stalled_us', 'limits')
  if not meta[1] then return {'no_run'} end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local served = served_clock(meta[2], meta[3], now, meta[4])
  local reply = {'leases', string.format('%.0f', now), string.format('%.0f', served), meta[2] or '',
    string.format('%.0f', stall_cap(meta[4]))}
  local fields = redis.call('HGETALL', KEYS[1])
  local stopped = {}
  for i = 1, #fields, 2 do
    local id = string.match(fields[i], '^(%d+):stopped$')
    if id then stopped[id] = fields[i + 1] end
  end
  for i = 1, #fields, 2 do
    local id = string.match(fields[i], '^(%d+):alive_until_us$')
    if id then
      reply[#reply + 1] = id
      reply[#reply + 1] = fields[i + 1]
      reply[#reply + 1] = stopped[id] or ''
    end
  end
  return reply
end

export('leases', leases)
