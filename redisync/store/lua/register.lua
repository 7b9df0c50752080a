-- register.lua: create a run with its schema, or compare with the schema already registered.
-- The first registration wins.
--
-- KEYS[1]          the run's meta hash
-- KEYS[2i], [2i+1] key-meta and data hashes of the i-th key of the schema (sorted by name)
-- ARGV[1]          the schema as canonical JSON;   ARGV[2] its digest
-- ARGV[3]          a fresh epoch id (used only when the run is created)
-- ARGV[4]          the limits in one field, as the fold reads them (Limits.packed: max_report_bytes|
--                  stream_maxlen|stream_payloads|dead_letter_maxlen|dead_letter_max_bytes|stall_after_us);
--                  the run's meta also keeps the first five as fields of their own, for readers of them
-- ARGV[5]          the announcements' window in microseconds (Limits.announce_every_us; 0: every fold)
-- ARGV[6 ...]      per key, one after another: name, semantics, m, d, then m field/value pairs of its
--                  key-meta hash and d of its data hash, as its spec gives them (SpecBase.meta_fields
--                  and data_fields: what the key declares and the state it starts from)
-- returns {'created' | 'exists' | 'mismatch', epoch, registered schema JSON}
--       | {'unknown_semantics', key, detail}   a key of a semantics these scripts do not know
--       | {'no_info', error}   the caller's role may not run INFO, without which the folds could not
--                              tell a restarted server (an epoch that lost writes) from the same one

-- the server process that holds the run: a fold on another one opens a new epoch (see fold.lua).
-- (the library's function redisync_register_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function register(KEYS, ARGV)
  local server, why = server_identity()
  if not server then return {'no_info', why} end

  -- each key's arguments (where they start), and a schema with a semantics this library has no module
  -- for (SEMANTICS) is refused whole
  local nkeys, at = (#KEYS - 1) / 2, {}
  local a = 6
  for i = 1, nkeys do
    at[i] = a
    if not SEMANTICS[ARGV[a + 1]] then
      return {'unknown_semantics', tostring(ARGV[a]), 'semantics ' ..
        string.format('%q', tostring(ARGV[a + 1])) .. ' is not one this server\'s scripts know'}
    end
    a = a + 4 + 2 * tonumber(ARGV[a + 2]) + 2 * tonumber(ARGV[a + 3])
  end

  local cur = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'schema')
  if cur[1] then
    return {cur[2] == ARGV[2] and 'exists' or 'mismatch', cur[1], cur[3]}
  end

  local limits = {}
  for field in string.gmatch(ARGV[4], '[^|]+') do limits[#limits + 1] = field end
  local t = redis.call('TIME')
  local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('HSET', KEYS[1], 'server', server, 'epoch', ARGV[3], 'digest', ARGV[2], 'schema', ARGV[1], 'fleet_version', 0,
    'keys', nkeys, 'created_at_us', now, 'updated_at_us', now,
    'max_report_bytes', limits[1], 'stream_maxlen', limits[2], 'dead_letter_maxlen', limits[4],
    'stream_payloads', limits[3], 'dead_letter_max_bytes', limits[5], 'limits', ARGV[4])
  if ARGV[5] ~= '0' then redis.call('HSET', KEYS[1], 'announce_every_us', ARGV[5]) end
  -- the keys that hold a slot per shard (their semantics' module says so: slots), and how long after its lease ended a departed shard id is
  -- forgotten (lease.lua): twice the longest grace of those keys (a state key's lease grace, a history
  -- key's retire_after_s), so every key has dropped or retired its slots first; none without a grace
  local slot_keys, longest = {}, nil
  for i = 1, nkeys do
    local a = at[i]
    if SEMANTICS[ARGV[a + 1]].slots then
      slot_keys[#slot_keys + 1] = ARGV[a]
      for j = a + 4, a + 3 + 2 * tonumber(ARGV[a + 2]), 2 do
        if ARGV[j] == 'declared' then
          local grace = tonumber(string.match(ARGV[j + 1], '^[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|'))
          if grace and (not longest or grace > longest) then longest = grace end
        end
      end
    end
  end
  if #slot_keys > 0 then redis.call('HSET', KEYS[1], 'slot_keys', table.concat(slot_keys, '\n')) end
  if longest then redis.call('HSET', KEYS[1], 'forget_after_us', string.format('%.0f', 2e6 * longest)) end
  for i = 1, nkeys do
    local a = at[i]
    local m, d = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    redis.call('HSET', KEYS[2 * i], 'semantics', ARGV[a + 1], 'version', 0, 'updated_at_us', now,
      unpack(ARGV, a + 4, a + 3 + 2 * m))
    if d > 0 then redis.call('HSET', KEYS[2 * i + 1], unpack(ARGV, a + 4 + 2 * m, a + 3 + 2 * m + 2 * d)) end
  end
  -- a new epoch, announced as a fold's version is: followers of a run lost and registered again learn it here
  announce(string.sub(KEYS[1], 1, -5) .. 'versions', '0 ' .. ARGV[3])
  return {'created', ARGV[3], ARGV[1]}
end

export('register', register)
