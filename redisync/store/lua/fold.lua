-- fold.lua: validate one shard report and fold it into the run's fleet state, all or nothing.
--
-- KEYS[1]            the run's meta hash        redisync:{run}:meta
-- KEYS[2]            the run's shards hash      redisync:{run}:shards
-- KEYS[3]            the reports stream         redisync:{run}:reports
-- KEYS[4]            the dead-letter stream     redisync:{run}:dead
-- KEYS[3 + 2i]       key-meta hash of the i-th reported key   redisync:{run}:key:<name>
-- KEYS[4 + 2i]       its data hash                             redisync:{run}:data:<name>
-- ARGV[1]            the client's schema digest
-- ARGV[2], [3], [4]  shard id, incarnation, seq (decimal integers)
-- ARGV[5]            the highest fleet version the client has seen: the new version is above it,
--                    so versions never go backwards for a client, even after a restart lost writes
-- ARGV[6]            one character per reported key: '1' if this incarnation resumed that key from
--                    a checkpoint (it takes over its previous life's slot), '0' otherwise
-- ARGV[5 + 2i]       name of the i-th key; ARGV[6 + 2i] its payload, little-endian float64:
--                    laid out as the key's semantics says (its Python module's payload_parts)
-- returns {'applied', fleet_version, now_us, epoch, version_1, ..., version_k, owed_in_us}, and announces
--         '<fleet_version> <epoch>' on the run's versions channel; with the run's announce_every_us,
--         at most once per that window: owed_in_us is then when the caller announces what its fold
--         left owed (announce.lua), or '' when it owes nothing
--       | {'duplicate', fleet_version}
--       | {'rejected', reason, key, detail}     (also appended to the dead-letter stream)
--
-- This is the envelope: the report's identity, duplicates and zombies, the run's epoch, clock and
-- fleet version, and (a key with a slot per shard) who has left it (lifecycle.lua, judged before the
-- key's check and recorded after its apply). Each key is checked and written by its semantics' module (semantics/<name>.lua,
-- found in SEMANTICS by the name its key meta holds; shared.lua says what a module provides). Every
-- check, including those of the stored state the fold reads, runs before the first write.
-- Idempotent: a retried call returns 'duplicate'.

-- (the library's function redisync_fold_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

-- The run's limits (the meta field 'limits', written at registration from Limits.packed():
-- max_report_bytes|stream_maxlen|stream_payloads|dead_letter_maxlen|dead_letter_max_bytes[|stall_after_us]), parsed
-- once per Lua VM and remembered by their own text. What is missing or not a number reads as it
-- always has: no report fits, a stream of 1000, no payloads, 10 000 dead letters of 64 MiB in all.
-- (A run registered before the field existed: its fields one by one.)
local LIMITS, nlimits = {}, 0
local function run_limits(text)
  if not text then
    local f = redis.call('HMGET', KEYS[1], 'max_report_bytes', 'stream_maxlen', 'stream_payloads',
      'dead_letter_maxlen', 'dead_letter_max_bytes')
    text = (f[1] or '') .. '|' .. (f[2] or '') .. '|' .. (f[3] or '') .. '|' .. (f[4] or '') .. '|' .. (f[5] or '')
  end
  local l = LIMITS[text]
  if l then return l end
  local max_bytes, maxlen, payloads, dead_maxlen, dead_bytes =
    string.match(text, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|?%d*$') -- (a sixth field: clock.lua's)
  l = {max_report_bytes = tonumber(max_bytes) or 0, max_report_text = max_bytes or text,
    stream_maxlen = maxlen and string.match(maxlen, '^%d+$') and maxlen or '1000', stream_payloads = payloads == '1',
    dead_letter_maxlen = tonumber(dead_maxlen) or 10000, dead_letter_max_bytes = tonumber(dead_bytes) or 67108864}
  if nlimits >= 256 then LIMITS, nlimits = {}, 0 end
  LIMITS[text], nlimits = l, nlimits + 1
  return l
end


local function newer(a, b) -- decimal strings without leading zeros: is a > b?
  if #a ~= #b then return #a > #b end
  return a > b
end

-- A run's key names, by its meta key; checked and made once per Lua VM (a pattern match and four
-- strings made at every fold otherwise). nil for a key that is not a run's meta key.
local RUNS, nruns = {}, 0
local function run_keys(meta_key)
  local names = RUNS[meta_key or '']
  if names then return names end
  local id = string.match(meta_key or '', '^redisync:{([%w_%.:%-]+)}:meta$')
  if not id or #id > 128 then return nil end
  local p = 'redisync:{' .. id .. '}:'
  names = {shards = p .. 'shards', reports = p .. 'reports', dead = p .. 'dead', versions = p .. 'versions',
    key = p .. 'key:', data = p .. 'data:', lease_ends = p .. 'lease_ends', gave_up = p .. 'gave_up',
    written = p .. 'written:'}
  if nruns >= 256 then RUNS, nruns = {}, 0 end -- (a bound on what the VM keeps)
  RUNS[meta_key], nruns = names, nruns + 1
  return names
end

-- Whether km and kd are the run's key-meta and data hashes of the key name: nil, or {kd, name, the
-- key's field in a report's stream entry, the semantics' module last seen for the key (UNSEEN before
-- its first fold)}; a pair found right is remembered (by its meta hash) for the VM's later folds.
local UNSEEN = {reads = function() end}
local PAIRS, npairs = {}, 0
local function key_pair(km, kd, name)
  local known = PAIRS[km]
  if known and known[1] == kd and known[2] == name then return known end
  if km ~= run.key .. name or kd ~= run.data .. name then return nil end
  if npairs >= 4096 then PAIRS, npairs = {}, 0 end
  known = {kd, name, 'report:' .. name, UNSEEN}
  PAIRS[km], npairs = known, npairs + 1
  return known
end

-- Shard ids and incarnations found well-formed, remembered for the VM's later folds (a pattern match
-- per fold otherwise), a shard id with the names of its fields (a string made per fold otherwise):
-- each set keeps at most 4096 (SIZES counts them).
local SHARD_IDS, INCARNATIONS, SIZES = {}, {}, {}
local function remember(set, s, value)
  local n = SIZES[set] or 0
  if n >= 4096 then
    for k in pairs(set) do set[k] = nil end
    n = 0
  end
  set[s], SIZES[set] = value, n + 1
end

-- the names of a shard's fields: in a key's data hash (slot, counts) and meta hash (slot_*), and in
-- the run's shards hash (the rest)
local function shard_fields(id)
  local slot = 'slot:' .. id
  return {slot = slot, counts = 'counts:' .. slot, slot_incarnation = slot .. ':incarnation', slot_seq = slot .. ':seq',
    slot_at = slot .. ':at_us', incarnation = id .. ':incarnation', seq = id .. ':seq', at = id .. ':at_us',
    seen = id .. ':seen', made = id .. ':made', alive = id .. ':alive_until_us'}
end

-- A key's declaration (the key-meta field 'declared', written at registration from the schema:
-- width|count_size|size|stale_after_s|lease_grace_s|lifecycle|owner), parsed once per Lua VM and
-- remembered by its own text, so a declaration changed in the store is read and checked anew. nil
-- for one that is not well-formed. (A run registered before the field existed: its fields one by one.)
local DECLARED, ndeclared = {}, 0
local function declaration(text, km)
  if not text then
    local f = redis.pcall('HMGET', km, 'width', 'count_size', 'size', 'stale_after_s', 'lease_grace_s',
      'lifecycle', 'owner')
    if f['err'] then return nil end
    for i = 1, 7 do f[i] = f[i] or '' end
    if f[2] == '' then f[2] = '0' end
    text = f[1] .. '|' .. f[2] .. '|' .. f[3] .. '|' .. f[4] .. '|' .. f[5] .. '|' .. f[6] .. '|' .. f[7]
  end
  local decl = DECLARED[text]
  if decl then return decl end
  local width, count_size, size, stale, grace, lifecycle, owner =
    string.match(text, '^([1-9]%d*)|(%d+)|([1-9]%d*)|([^|]*)|([^|]*)|(%l*)|(%d*)$')
  if not width or #width > 9 or #count_size > 9 or #size > 9 then return nil end
  decl = {width = width + 0, count_size = count_size + 0, size = size + 0, stale = tonumber(stale),
    grace = tonumber(grace), lifecycle = lifecycle, owner = owner, bytes = string.format('%d bytes', 8 * width)}
  if (stale ~= '' and not decl.stale) or (grace ~= '' and not decl.grace) then return nil end
  if ndeclared >= 4096 then DECLARED, ndeclared = {}, 0 end
  DECLARED[text], ndeclared = decl, ndeclared + 1
  return decl
end

-- A key's meta fields a fold reads: its semantics, declaration and version, the life cycle's (a key
-- with a slot per shard: lifecycle.lua) and what its semantics' check reads (call: redis.pcall, or
-- redis.call once the key is known to be a hash).
local LIFE = LIFECYCLE.reads
local function spec_of(call, km, module)
  if module.slots then
    return call('HMGET', km, 'semantics', 'declared', 'version', LIFE[1], LIFE[2], LIFE[3], module.reads(own))
  end
  return call('HMGET', km, 'semantics', 'declared', 'version', module.reads(own))
end

-- The reported keys' items (what each key's check leaves for its apply), one table per position in
-- the report for every fold of the VM: the fold sets every field of the ones it uses before a check
-- reads them (a table made per key per fold costs its size, and a collection step later), and lets
-- go of the payloads once it has written them (each apply lets go of what it made).
local ITEMS = {}
local function let_go(n)
  for i = 1, n do ITEMS[i].payload = false end
end

local function fold(keys, args)
  KEYS, ARGV = keys, args
  if not sunpack then local struct = struct_library(); sunpack, spack = struct.unpack, struct.pack end
  run = run_keys(KEYS[1])
  if not run then return {'rejected', 'malformed', '', 'KEYS[1] is not a redisync meta key'} end

  meta = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'limits', 'fleet_version', 'server', 'announce_every_us',
    'announced_us', 'announce_owed')
  shard, inc, seq, floor, resume = ARGV[2] or '', ARGV[3] or '', ARGV[4] or '', ARGV[5] or '', ARGV[6] or ''
  -- a rejection for a run that does not exist writes nothing: no key of an unknown run is created
  if not meta[1] then return {'rejected', 'no_run', '', 'the run is not registered (or the store lost it)'} end
  limits = run_limits(meta[3])


  -- the envelope -------------------------------------------------------------------------------
  if KEYS[2] ~= run.shards or KEYS[3] ~= run.reports or KEYS[4] ~= run.dead then
    return reject('malformed', '', 'KEYS[2..4] are not this run\'s shards, reports and dead-letter keys')
  end
  if ARGV[1] ~= meta[2] then
    return reject('schema_mismatch', '', 'the report was made against schema ' .. tostring(ARGV[1]) ..
      ', the run is registered with ' .. tostring(meta[2]))
  end
  own = SHARD_IDS[shard]
  if not own then
    if not string.match(shard, '^%d+$') or #shard > 9 or (#shard > 1 and string.sub(shard, 1, 1) == '0') then
      return reject('malformed', '', 'shard id must be a decimal integer, got ' .. string.format('%q', shard))
    end
    own = shard_fields(shard)
    remember(SHARD_IDS, shard, own)
  end
  if not INCARNATIONS[inc] then
    if not string.match(inc, '^[1-9]%d*$') or #inc > 20 then
      return reject('malformed', '', 'incarnation must be a positive decimal integer, got ' .. string.format('%q', inc))
    end
    remember(INCARNATIONS, inc, true)
  end
  if not string.match(seq, '^%d+$') or #seq > 15 then
    return reject('malformed', '', 'seq must be a decimal integer below 1e15, got ' .. string.format('%q', seq))
  end
  if not string.match(floor, '^%d+$') or #floor > 15 then
    return reject('malformed', '', 'the known fleet version must be a decimal integer, got ' .. string.format('%q', floor))
  end
  nkeys = (#ARGV - 6) / 2
  if nkeys < 1 or nkeys ~= math.floor(nkeys) or #KEYS ~= 4 + 2 * nkeys then
    return reject('malformed', '', 'expected one (name, payload) pair per reported key and two KEYS per key')
  end
  if #resume ~= nkeys or string.find(resume, '[^01]') then
    return reject('malformed', '', 'ARGV[6] must hold one resume flag (0 or 1) per reported key')
  end
  fleet_version = tonumber(meta[4])
  if not fleet_version then return reject('corrupt_state', '', 'the run\'s fleet_version is missing or not a number') end

  -- duplicates, retries and zombies --------------------------------------------------------------
  cur = redis.call('HMGET', KEYS[2], own.incarnation, own.seq)
  if cur[1] then
    if newer(cur[1], inc) then
      return reject('stale_incarnation', '', 'incarnation ' .. inc .. ' is older than the shard\'s current ' .. cur[1])
    end
    if cur[1] == inc then
      local last = tonumber(cur[2]) or 0
      if seq + 0 == last then return {'duplicate', fleet_version} end -- (checked decimals: + 0, not a C call)
      if seq + 0 < last then
        return reject('seq_rollback', '', 'seq ' .. seq .. ' is below the last folded seq ' .. tostring(cur[2]))
      end
    end
  end

  local total = 0
  for i = 1, nkeys do total = total + #ARGV[6 + 2 * i] end
  if total > limits.max_report_bytes then
    return reject('too_large', '', 'payload of ' .. total .. ' bytes exceeds max_report_bytes=' .. limits.max_report_text)
  end

  local t = redis.call('TIME')
  now_s = t[1] .. string.sub('00000' .. t[2], -6) -- (microseconds, without a float format)
  now = t[1] * 1000000 + t[2]
  clock_read = false
  FOLD.shard, FOLD.inc, FOLD.seq, FOLD.now_s, FOLD.now, FOLD.own, FOLD.run, FOLD.run_meta, FOLD.shards =
    shard, inc, seq, now_s, now, own, run, KEYS[1], KEYS[2]

  -- The server process: a fold by another process than the previous fold's (a restart, a failover)
  -- may follow lost writes, so it opens a new epoch; every client then takes the whole state and
  -- re-publishes, and no (epoch, version) pair ever names two states.
  server = server_identity() -- (nil where the ACL denies INFO and no call has read it yet: the field stays)
  epoch = meta[1]
  if server and meta[5] and meta[5] ~= '' and meta[5] ~= server then epoch = string.sub(server, 1, 8) .. '-' .. now_s end

  -- validate and compute every key before writing anything (a report applies all or none) ------------
  local items, seen = ITEMS, {}
  for i = 1, nkeys do
    local name, payload = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
    local resumed = string.sub(resume, i, i) == '1'
    if seen[name] then return reject('malformed', name, 'key reported twice') end
    seen[name] = true
    local km, kd = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
    local pair = key_pair(km, kd, name)
    if not pair then
      return reject('malformed', name, 'KEYS do not match the reported key names')
    end
    -- (a key of another type fails its first read, which is then refused: no TYPE call per key)
    -- (with the fields the key's semantics reads, as last seen for this key: a second read where the
    -- semantics is not the one last seen)
    local module = pair[4]
    local spec = spec_of(redis.pcall, km, module)
    if spec['err'] then return reject('corrupt_state', name, not_hash(km)) end
    if not spec[1] then return reject('unknown_key', name, 'not declared in the run\'s schema') end
    if SEMANTICS[spec[1]] ~= module then
      module = SEMANTICS[spec[1]]
      if not module then return reject('corrupt_state', name, 'unknown semantics ' .. string.format('%q', spec[1])) end
      pair[4] = module
      spec = spec_of(redis.call, km, module)
    end
    local decl, version = declaration(spec[2], km), tonumber(spec[3])
    if not decl then
      return reject('corrupt_state', name, 'the key\'s declaration ' .. string.format('%q', tostring(spec[2])) ..
        ' is not width|count_size|size|stale_after_s|lease_grace_s|lifecycle|owner')
    end
    if not version then return reject('corrupt_state', name, 'the key\'s version is missing') end
    local width = decl.width
    if #payload ~= width * 8 then
      return reject('shape', name, 'payload is ' .. #payload .. ' bytes, the key needs ' .. (width * 8) ..
        ' (' .. width .. ' float64)')
    end
    -- (every field the check and the apply may set is set here: the table is the VM's, see ITEMS)
    local item = ITEMS[i]
    if not item then item = {}; ITEMS[i] = item end
    item.name, item.payload, item.module, item.meta, item.data, item.version = name, payload, module, km, kd,
      version + 1
    item.field, item.bytes = pair[3], decl.bytes -- (its stream entry's field, and what it says of the payload)
    item.graced = decl.grace and true or false -- (a lease grace: the fold reads the run's clock)
    if module.slots then LIFECYCLE.judge(item, spec, decl, FOLD) end -- (who has left: item.life)
    local bad = module.check(item, spec, decl, resumed, FOLD)
    if bad then return bad end
  end

  -- apply ------------------------------------------------------------------------------------------
  -- The stream entry is the first write: a reports key that is not a stream fails it, and the fold
  -- then stops with nothing written. (A rejection checks the dead-letter key's type itself.)
  fleet_version = math.max(fleet_version, floor + 0) + 1
  -- (numbers go to redis.call as decimal strings made once: Redis makes a string of a Lua number with
  -- a float printf, at every argument)
  local fv = string.format('%d', fleet_version)
  local entry = {'XADD', KEYS[3], 'MAXLEN', '~', limits.stream_maxlen, '*',
    'shard', shard, 'incarnation', inc, 'seq', seq, 'fleet_version', fv}
  for i = 1, nkeys do
    -- the envelope names every key; the payloads themselves only for a run that asked (stream_payloads)
    entry[#entry + 1] = items[i].field
    entry[#entry + 1] = limits.stream_payloads and items[i].payload or items[i].bytes
  end
  local added = redis.pcall(unpack(entry))
  if type(added) == 'table' and added['err'] then
    -- a role that may read the run but not write it (the inspector): its error, nothing written
    if string.find(tostring(added['err']), 'NOPERM', 1, true) then return redis.error_reply(tostring(added['err'])) end
    return {'rejected', 'corrupt_state', '', KEYS[3] .. ' is a ' .. redis.call('TYPE', KEYS[3])['ok'] .. ', not a stream'}
  end

  local versions = {}
  for i = 1, nkeys do
    local item = items[i]
    item.module.apply(item, FOLD)
    if item.module.slots then LIFECYCLE.record(item, FOLD) end
    versions[i] = item.version
  end

  -- (what has not changed is not written again: the epoch and the server change with the server,
  -- an incarnation with the process)
  if epoch ~= meta[1] or (server and server ~= meta[5]) then
    redis.call('HSET', KEYS[1], 'epoch', epoch, 'server', server or meta[5] or '')
  end
  -- a shard that folds a key with a lease grace after its lease ran out (or was given up) lived on: it
  -- counts until a grace past this fold unless it renews (a shard that never leased is not judged)
  local graced = false
  for i = 1, nkeys do graced = graced or items[i].graced end
  if graced then
    run_clock()
    local alive = tonumber(redis.call('HGET', KEYS[2], own.alive))
    if alive and alive < served then
      local text = string.format('%.0f', served)
      redis.call('HSET', KEYS[2], own.alive, text)
      redis.call('ZADD', run.lease_ends, text, shard) -- (the index of lease ends, see lease.lua)
    elseif alive then -- (indexed where it stands: a lease renewed by an earlier redisync is not)
      redis.call('ZADD', run.lease_ends, string.format('%.0f', alive), shard)
    end
  end
  if clock_read then
    redis.call('HSET', KEYS[1], 'fleet_version', fv, 'updated_at_us', now_s, 'clock_wall_us', now_s)
    if stalled_s then redis.call('HSET', KEYS[1], 'clock_stalled_us', stalled_s) end
  else
    redis.call('HSET', KEYS[1], 'fleet_version', fv, 'updated_at_us', now_s)
  end
  if cur[1] ~= inc then redis.call('HSET', KEYS[2], own.incarnation, inc) end
  -- (seen: the highest fleet version the shard had seen when it reported, made: the version its report
  -- made; for `redisync watch`: how far behind the shard's view was, and what it samples)
  redis.call('HSET', KEYS[2], own.seq, seq, own.at, now_s, own.seen, floor, own.made, fv)

  -- the new version announced (with the epoch: a run lost and registered again starts its versions
  -- over, so a version alone would not tell its followers), at most once per the run's window: a fold
  -- inside it leaves the announcement owed, and the first such fold's caller is told when to pay it
  -- (announce.lua), so a burst's last version is announced too
  local trail = ''
  local every = meta[6]
  if not every then
    announce(run.versions, fv .. ' ' .. epoch)
  else
    local since = tonumber(now_s) - (tonumber(meta[7]) or 0)
    if since >= tonumber(every) then
      announce(run.versions, fv .. ' ' .. epoch)
      redis.call('HSET', KEYS[1], 'announced_us', now_s, 'announce_owed', '0')
    elseif meta[8] ~= '1' then
      redis.call('HSET', KEYS[1], 'announce_owed', '1')
      trail = string.format('%.0f', tonumber(every) - since)
    end
  end

  let_go(nkeys)
  local reply = {'applied', fleet_version, now_s, epoch}
  for i = 1, nkeys do reply[4 + i] = versions[i] end
  reply[5 + nkeys] = trail
  return reply
end

export('fold', fold)

