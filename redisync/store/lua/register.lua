-- register.lua: create a run with its schema, or compare with the schema already registered.
-- The first registration wins.
--
-- KEYS[1]          the run's meta hash
-- KEYS[2i], [2i+1] key-meta and data hashes of the i-th key of the schema (sorted by name)
-- ARGV[1]          the schema as canonical JSON;   ARGV[2] its digest
-- ARGV[3]          a fresh epoch id (used only when the run is created)
-- ARGV[4], [5], [6], [7], [8] limits: max_report_bytes, stream_maxlen, dead_letter_maxlen, stream_payloads
--                  ('1' or '0'), dead_letter_max_bytes
-- ARGV[9]          the same limits in one field, as the fold reads them (Limits.packed)
-- ARGV[10 + 12(i-1) ...] per key: name, semantics, shape ('4x3'), size, width, owner (''), stale_after_s (''),
--                  count_size, sumsq ('1' or '0'), lifecycle ('history' or 'state'), lease_grace_s ('': none;
--                  the fold reads it for state keys only), declared (what the fold reads of them, in one
--                  field: see SpecBase.declared)
-- returns {'created' | 'exists' | 'mismatch', epoch, registered schema JSON}
--       | {'unknown_semantics', key, detail}   a key of a semantics these scripts do not know
--       | {'no_info', error}   the caller's role may not run INFO, without which the folds could not
--                              tell a restarted server (an epoch that lost writes) from the same one

-- the server process that holds the run: a fold on another one opens a new epoch (see fold.lua).
-- (the library's function redisync_register_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

local function register(KEYS, ARGV)
  local server, why = server_identity()
  if not server then return {'no_info', why} end

  -- the semantics fold.lua knows (its CHECKS and APPLIES): a schema with another is refused whole
  local KNOWN = {broadcast = true, merge = true, maximum = true}
  for i = 1, (#KEYS - 1) / 2 do
    local semantics = ARGV[10 + 12 * (i - 1) + 1]
    if not KNOWN[semantics] then
      return {'unknown_semantics', tostring(ARGV[10 + 12 * (i - 1)]), 'semantics ' ..
        string.format('%q', tostring(semantics)) .. ' is not one this server\'s scripts know'}
    end
  end

  local cur = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'schema')
  if cur[1] then
    return {cur[2] == ARGV[2] and 'exists' or 'mismatch', cur[1], cur[3]}
  end

  local t = redis.call('TIME')
  local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  local nkeys = (#KEYS - 1) / 2
  redis.call('HSET', KEYS[1], 'server', server, 'epoch', ARGV[3], 'digest', ARGV[2], 'schema', ARGV[1], 'fleet_version', 0,
    'keys', nkeys, 'created_at_us', now, 'updated_at_us', now,
    'max_report_bytes', ARGV[4], 'stream_maxlen', ARGV[5], 'dead_letter_maxlen', ARGV[6], 'stream_payloads', ARGV[7], 'dead_letter_max_bytes', ARGV[8],
    'limits', ARGV[9])
  for i = 1, nkeys do
    local a = 10 + 12 * (i - 1)
    local name, semantics, shape, size, width, owner, stale =
      ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], ARGV[a + 6]
    redis.call('HSET', KEYS[2 * i], 'name', name, 'semantics', semantics, 'declared', ARGV[a + 11], 'shape', shape,
      'size', size, 'width', width, 'owner', owner, 'stale_after_s', stale, 'version', 0, 'updated_at_us', now)
    if semantics == 'merge' then
      redis.call('HSET', KEYS[2 * i], 'writers', '', 'count_size', ARGV[a + 7], 'sumsq', ARGV[a + 8],
        'lifecycle', ARGV[a + 9], 'lease_grace_s', ARGV[a + 9] == 'state' and ARGV[a + 10] or '')
      redis.call('HSET', KEYS[2 * i + 1], 'agg', string.rep('\0', 8 * tonumber(width)))
    end
  end
  -- a new epoch, announced as a fold's version is: followers of a run lost and registered again learn it here
  redis.call('PUBLISH', string.sub(KEYS[1], 1, -5) .. 'versions', '0 ' .. ARGV[3])
  return {'created', ARGV[3], ARGV[1]}
end

export('register', register)
