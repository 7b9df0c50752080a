-- pull.lua: the fleet state a collector has not seen yet, in one round trip. Read-only.
--
-- KEYS[1]          the run's meta hash
-- KEYS[2i], [2i+1] key-meta and data hashes of the i-th key of the caller's schema
-- ARGV[1]          the caller's shard id ('' for a reader without a slot, e.g. the learner)
-- ARGV[2]          the epoch the caller knows ('' if none)
-- ARGV[3]          the fleet version the caller knows
-- ARGV[3 + i]      the version of the i-th key the caller knows
-- returns nil when the caller is current (same epoch and fleet version)
--       | {'no_run'}
--       | {'corrupt_state', key, detail}   a key's stored semantics is not one these scripts know
--       | {'changed', epoch, fleet_version, now_us,
--          then per changed key: index, version, value, own_slot, own_incarnation}
--         where value is the key's fleet value ('' if never written) and own_slot the caller's slot as
--         folded ('' if none, or the semantics keeps no slots), as the key's semantics' module reads
--         them (its pull: see shared.lua)
-- (the library's function redisync_pull_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function pull(KEYS, ARGV)
  local meta = redis.call('HMGET', KEYS[1], 'epoch', 'fleet_version')
  if not meta[1] then return {'no_run'} end
  local same_epoch = meta[1] == ARGV[2]
  if same_epoch and meta[2] == ARGV[3] then return nil end

  local t = redis.call('TIME')
  local reply = {'changed', meta[1], meta[2], string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))}
  local shard = ARGV[1]
  for i = 1, (#KEYS - 1) / 2 do
    local km, kd = KEYS[2 * i], KEYS[2 * i + 1]
    local info = redis.call('HMGET', km, 'version', 'semantics')
    if info[1] and (not same_epoch or info[1] ~= ARGV[3 + i]) then
      local module = SEMANTICS[info[2]]
      if not module then
        return {'corrupt_state', km, 'semantics ' .. string.format('%q', tostring(info[2])) ..
          ' is not one this server\'s scripts know'}
      end
      local value, own, own_inc = module.pull(km, kd, shard)
      reply[#reply + 1] = i
      reply[#reply + 1] = tonumber(info[1])
      reply[#reply + 1] = value or ''
      reply[#reply + 1] = own or ''
      reply[#reply + 1] = own_inc or ''
    end
  end
  return reply
end

export('pull', pull)
