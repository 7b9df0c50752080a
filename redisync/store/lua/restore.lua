-- restore.lua: replace a run's state by a snapshot's, in one atomic step (no fold in between).
--
-- KEYS[1]          the run's meta hash;   KEYS[2] the run's shards hash
-- KEYS[2i+1], [2i+2] key-meta and data hashes of the i-th key of the snapshot's schema
-- ARGV[1]          the new epoch id
-- ARGV[2 ...]      per KEYS[h], in order: the number of fields n, then n (field, value) pairs
-- returns {'restored', epoch, fleet_version}, and announces '<fleet_version> <epoch>'
--                  on the run's versions channel
--
-- The client validated every hash and vector before calling. Versions continue above both the
-- current and the snapshot's, so no client sees one go backwards. The shards hash keeps the
-- current entry of every shard id the run knows (its live collectors keep publishing; a slot of
-- another incarnation in the snapshot is a previous life to them) and takes the snapshot's entry
-- only for ids the run does not know (zombies of the snapshot's time stay refused).
-- (the library's function redisync_restore_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function restore(KEYS, ARGV)
  local function num(v) return tonumber(v) or 0 end

  local server = server_identity() -- the server process (nil: the field stays as it is)

  local current_fleet = num(redis.call('HGET', KEYS[1], 'fleet_version'))
  local current_versions = {}
  for h = 3, #KEYS, 2 do current_versions[h] = num(redis.call('HGET', KEYS[h], 'version')) end
  local current_shards = redis.call('HGETALL', KEYS[2])
  -- the run's served clock stays the run's (its shards' leases are kept in it, see clock.lua)
  local clock = redis.call('HMGET', KEYS[1], 'clock_wall_us', 'clock_stalled_us', 'gave_up_seq')
  local known = {}
  for i = 1, #current_shards, 2 do known[string.match(current_shards[i], '^([^:]+):')] = true end

  redis.call('DEL', unpack(KEYS))
  local pos = 2
  local snap_fleet, snap_versions = 0, {}
  for h = 1, #KEYS do
    local n = tonumber(ARGV[pos])
    pos = pos + 1
    local batch = {}
    for i = 0, n - 1 do
      local field, value = ARGV[pos + 2 * i], ARGV[pos + 2 * i + 1]
      if h == 1 and field == 'fleet_version' then snap_fleet = num(value) end
      if h >= 3 and h % 2 == 1 and field == 'version' then snap_versions[h] = num(value) end
      local id = h == 2 and string.match(field, '^([^:]+):')
      if not (id and known[id]) then
        batch[#batch + 1] = field
        batch[#batch + 1] = value
      end
      if #batch >= 2000 then redis.call('HSET', KEYS[h], unpack(batch)); batch = {} end
    end
    if #batch > 0 then redis.call('HSET', KEYS[h], unpack(batch)) end
    pos = pos + 2 * n
  end
  for i = 1, #current_shards, 2000 do
    redis.call('HSET', KEYS[2], unpack(current_shards, i, math.min(i + 1999, #current_shards)))
  end
  -- the snapshot's shards indexed by their lease's end (a give-up: when, as the snapshot says), so that a key
  -- retires, and the run forgets, a shard of the snapshot that does not come back (lease.lua)
  local t = redis.call('TIME')
  local served = served_clock(clock[1], clock[2], tonumber(t[1]) * 1000000 + tonumber(t[2]),
    redis.call('HGET', KEYS[1], 'limits'))
  local restored_ends = {}
  local given_up, ended = {}, {}
  local now_shards = redis.call('HGETALL', KEYS[2])
  for i = 1, #now_shards, 2 do
    local id = string.match(now_shards[i], '^(%d+):ended_us$')
    if id then ended[id] = now_shards[i + 1] end
  end
  for i = 1, #now_shards, 2 do
    local id = string.match(now_shards[i], '^(%d+):alive_until_us$')
    local u = tonumber(now_shards[i + 1])
    if id and not known[id] and u then
      local at = u >= 0 and string.format('%.0f', u) or ended[id] or string.format('%.0f', served)
      restored_ends[#restored_ends + 1] = at
      restored_ends[#restored_ends + 1] = id
      if u < 0 and not ended[id] then -- (a snapshot taken before give-ups said when: as if given up now)
        given_up[#given_up + 1] = id .. ':ended_us'
        given_up[#given_up + 1] = at
      end
    end
  end
  for i = 1, #given_up, 2000 do
    redis.call('HSET', KEYS[2], unpack(given_up, i, math.min(i + 1999, #given_up)))
  end
  local prefix_ends = string.sub(KEYS[1], 1, -5) .. 'lease_ends'
  for i = 1, #restored_ends, 2000 do
    redis.call('ZADD', prefix_ends, unpack(restored_ends, i, math.min(i + 1999, #restored_ends)))
  end

  local fleet_version = math.max(current_fleet, snap_fleet) + 1
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'fleet_version', fleet_version)
  if server then redis.call('HSET', KEYS[1], 'server', server) end
  if clock[1] then redis.call('HSET', KEYS[1], 'clock_wall_us', clock[1], 'clock_stalled_us', clock[2] or '0') end
  -- the liveness indexes (the run's give-ups, in order; each state key's writers by write time) are
  -- the run's, not the snapshot's: the count of give-ups goes on, and each key's next fold looks at
  -- every writer once and indexes them again
  if clock[3] then redis.call('HSET', KEYS[1], 'gave_up_seq', clock[3]) end
  local prefix = string.sub(KEYS[1], 1, -5)
  for h = 3, #KEYS, 2 do
    redis.call('HSET', KEYS[h], 'version', math.max(current_versions[h], snap_versions[h] or 0) + 1)
    redis.call('HDEL', KEYS[h], 'stale_seen', 'lapse_seen')
    redis.call('DEL', prefix .. 'written:' .. string.sub(KEYS[h], #prefix + #'key:' + 1))
  end
  -- announced like a fold: a collector that follows the channel polls nothing while it is quiet
  announce(string.sub(KEYS[1], 1, -5) .. 'versions', fleet_version .. ' ' .. ARGV[1])
  return {'restored', ARGV[1], fleet_version}
end

export('restore', restore)
