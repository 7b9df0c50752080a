-- fold.lua: validate one shard report and fold it into the run's fleet state, atomically.
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
-- ARGV[4 + 2i]       name of the i-th key; ARGV[5 + 2i] its payload, little-endian float64:
--                    a broadcast value, or a merge key's count || sum [|| sumsq]
-- returns {'applied', fleet_version, now_us, version_1, ..., version_k}
--       | {'duplicate', fleet_version}
--       | {'rejected', reason, key, detail}     (also appended to the dead-letter stream)
--
-- Idempotent: a retried call (same shard, incarnation and seq) returns 'duplicate'. The work is
-- O(payload): the merge aggregate is updated as (agg - old slot) + new slot, as semantics.py does.

local CHUNK = 128
local FMT = '<' .. string.rep('d', CHUNK)
local sunpack, spack = struct.unpack, struct.pack

local prefix = string.match(KEYS[1] or '', '^(redisync:{[^}]+}:)meta$')
if not prefix then
  return {'rejected', 'malformed', '', 'KEYS[1] is not a redisync meta key'}
end

local meta = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'max_report_bytes', 'stream_maxlen', 'dead_letter_maxlen',
  'fleet_version')
local dead_maxlen = tonumber(meta[5]) or 10000
local shard, inc, seq, floor = ARGV[2] or '', ARGV[3] or '', ARGV[4] or '', ARGV[5] or ''

local function reject(reason, key, detail)
  local entry = {'XADD', prefix .. 'dead', 'MAXLEN', '~', dead_maxlen, '*',
    'reason', reason, 'key', key, 'detail', detail, 'shard', shard, 'incarnation', inc, 'seq', seq}
  local budget = tonumber(meta[3]) or 1048576
  for i = 6, #ARGV, 2 do
    local name, payload = ARGV[i], ARGV[i + 1] or ''
    if #payload > budget then payload = string.sub(payload, 1, budget); name = name .. ' (truncated)' end
    budget = budget - #payload
    entry[#entry + 1] = 'report:' .. name
    entry[#entry + 1] = payload
  end
  redis.call(unpack(entry))
  return {'rejected', reason, key, detail}
end

-- the envelope -------------------------------------------------------------------------------
if not meta[1] then return reject('no_run', '', 'the run is not registered (or the store lost it)') end
if KEYS[2] ~= prefix .. 'shards' or KEYS[3] ~= prefix .. 'reports' or KEYS[4] ~= prefix .. 'dead' then
  return reject('malformed', '', 'KEYS[2..4] are not this run\'s shards, reports and dead-letter keys')
end
if ARGV[1] ~= meta[2] then
  return reject('schema_mismatch', '', 'the report was made against schema ' .. tostring(ARGV[1]) ..
    ', the run is registered with ' .. meta[2])
end
if not string.match(shard, '^%d+$') or #shard > 9 or (#shard > 1 and string.sub(shard, 1, 1) == '0') then
  return reject('malformed', '', 'shard id must be a decimal integer, got ' .. string.format('%q', shard))
end
if not string.match(inc, '^[1-9]%d*$') or #inc > 20 then
  return reject('malformed', '', 'incarnation must be a positive decimal integer, got ' .. string.format('%q', inc))
end
if not string.match(seq, '^%d+$') or #seq > 15 then
  return reject('malformed', '', 'seq must be a decimal integer below 1e15, got ' .. string.format('%q', seq))
end
if not string.match(floor, '^%d+$') or #floor > 15 then
  return reject('malformed', '', 'the known fleet version must be a decimal integer, got ' .. string.format('%q', floor))
end
local nkeys = (#ARGV - 5) / 2
if nkeys < 1 or nkeys ~= math.floor(nkeys) or #KEYS ~= 4 + 2 * nkeys then
  return reject('malformed', '', 'expected one (name, payload) pair per reported key and two KEYS per key')
end

-- duplicates, retries and zombies --------------------------------------------------------------
local function newer(a, b) -- decimal strings without leading zeros: is a > b?
  if #a ~= #b then return #a > #b end
  return a > b
end
local cur = redis.call('HMGET', KEYS[2], shard .. ':incarnation', shard .. ':seq')
local fleet_version = tonumber(meta[6]) or 0
if cur[1] then
  if newer(cur[1], inc) then
    return reject('stale_incarnation', '', 'incarnation ' .. inc .. ' is older than the shard\'s current ' .. cur[1])
  end
  if cur[1] == inc then
    local last = tonumber(cur[2])
    if tonumber(seq) == last then return {'duplicate', fleet_version} end
    if tonumber(seq) < last then
      return reject('seq_rollback', '', 'seq ' .. seq .. ' is below the last folded seq ' .. cur[2])
    end
  end
end

local total = 0
for i = 1, nkeys do total = total + #ARGV[5 + 2 * i] end
if total > (tonumber(meta[3]) or 0) then
  return reject('too_large', '', 'payload of ' .. total .. ' bytes exceeds max_report_bytes=' .. tostring(meta[3]))
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)

-- vector helpers: payloads are decoded CHUNK values at a time ----------------------------------------
local function fmt_of(len)
  return len == CHUNK and FMT or '<' .. string.rep('d', len)
end

local function combine(a, b, width, sign) -- bytes of a + sign * b
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    local x = {struct.unpack(fmt, a, pos)}
    local y = {struct.unpack(fmt, b, pos)}
    for j = 1, len do x[j] = x[j] + sign * y[j] end
    out[#out + 1] = struct.pack(fmt, unpack(x, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  return table.concat(out)
end

-- Checks the new payload and, for merge keys, computes (agg - old) + new in the same pass.
-- Elements in (nonneg_upto, nonneg_from] may be negative (a merge key's sum part).
-- returns the new aggregate bytes (merge) or true (broadcast), or nil and the rejection.
local function check_and_fold(name, payload, width, nonneg_upto, nonneg_from, agg, old)
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    local c = {sunpack(fmt, payload, pos)}
    local a = agg and {sunpack(fmt, agg, pos)}
    local o = old and {sunpack(fmt, old, pos)}
    -- each run of this chunk lies in one part: non-negative (count, sumsq) or signed (sum)
    local j = 1
    while j <= len do
      local g = base + j  -- 1-based index in the payload
      local signed = g > nonneg_upto and g <= nonneg_from
      local stop = math.min(len, (signed and nonneg_from or (g <= nonneg_upto and nonneg_upto or width)) - base)
      for k = j, stop do
        local v = c[k]
        if v - v ~= 0 then return nil, {'non_finite', name, 'element ' .. (base + k - 1) .. ' is not finite'} end
        if v < 0 and not signed then
          return nil, {'negative', name, 'element ' .. (base + k - 1) .. ' is ' .. string.format('%.17g', v) ..
            ' in a count or sumsq part (must be >= 0)'}
        end
      end
      if o then
        for k = j, stop do a[k] = (a[k] - o[k]) + c[k] end
      elseif a then
        for k = j, stop do a[k] = a[k] + c[k] end
      end
      j = stop + 1
    end
    if a then out[#out + 1] = spack(fmt, unpack(a, 1, len)) end
    base = base + len
    pos = pos + len * 8
  end
  return agg and table.concat(out) or true
end

-- validate and compute every key before writing anything (a report applies all or none) ------------
local items, seen = {}, {}
for i = 1, nkeys do
  local name, payload = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  if seen[name] then return reject('malformed', name, 'key reported twice') end
  seen[name] = true
  local km, kd = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  if km ~= prefix .. 'key:' .. name or kd ~= prefix .. 'data:' .. name then
    return reject('malformed', name, 'KEYS do not match the reported key names')
  end
  local spec = redis.call('HMGET', km, 'semantics', 'width', 'count_size', 'owner', 'stale_after_s', 'version', 'writers',
    'slot:' .. shard .. ':incarnation', 'size')
  if not spec[1] then return reject('unknown_key', name, 'not declared in the run\'s schema') end
  local width = tonumber(spec[2])
  if #payload ~= width * 8 then
    return reject('shape', name, 'payload is ' .. #payload .. ' bytes, the key needs ' .. (width * 8) ..
      ' (' .. width .. ' float64)')
  end
  local item = {name = name, payload = payload, semantics = spec[1], meta = km, data = kd,
    version = tonumber(spec[6]) + 1}
  local folded, why
  if spec[1] == 'broadcast' then
    if spec[4] ~= '' and spec[4] ~= shard then
      return reject('not_owner', name, 'shard ' .. shard .. ' may not write a key owned by shard ' .. spec[4])
    end
    folded, why = check_and_fold(name, payload, width, 0, width)
  else
    local stale = tonumber(spec[5])
    local count_size = tonumber(spec[3])
    local data = redis.call('HMGET', kd, 'agg', 'slot:' .. shard)
    local agg, old = data[1], data[2]
    item.forget = {}
    if old and spec[8] ~= inc then
      -- the shard restarted: its previous life's statistics leave the slot
      if stale then
        agg = combine(agg, old, width, -1)
      else
        local retired = redis.call('HGET', kd, 'retired')
        item.retired = retired and combine(retired, old, width, 1) or old
      end
      old = nil
    end
    -- a slot not refreshed for stale_after_s stops weighting the fleet
    local live = {}
    local ids = {}
    for id in string.gmatch(spec[7] or '', '%d+') do
      if id ~= shard then ids[#ids + 1] = id end
    end
    table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
    if stale and #ids > 0 then
      local fields = {}
      for k, id in ipairs(ids) do fields[k] = 'slot:' .. id .. ':at_us' end
      local at = redis.call('HMGET', km, unpack(fields))
      for k, id in ipairs(ids) do
        if now - tonumber(at[k]) > stale * 1e6 then
          agg = combine(agg, redis.call('HGET', kd, 'slot:' .. id), width, -1)
          item.forget[#item.forget + 1] = id
        else
          live[#live + 1] = id
        end
      end
    else
      live = ids
    end
    live[#live + 1] = shard
    table.sort(live, function(a, b) return tonumber(a) < tonumber(b) end)
    item.writers = table.concat(live, ',')
    -- the sum part, right after the count, is the only signed one
    folded, why = check_and_fold(name, payload, width, count_size, count_size + tonumber(spec[9]), agg, old)
  end
  if not folded then return reject(why[1], why[2], why[3]) end
  item.agg = folded
  items[i] = item
end

-- apply ------------------------------------------------------------------------------------------
local versions = {}
for i = 1, nkeys do
  local item = items[i]
  if item.semantics == 'merge' then
    for _, id in ipairs(item.forget) do
      redis.call('HDEL', item.meta, 'slot:' .. id .. ':incarnation', 'slot:' .. id .. ':seq',
        'slot:' .. id .. ':at_us', 'slot:' .. id .. ':count')
      redis.call('HDEL', item.data, 'slot:' .. id)
    end
    if #item.forget > 0 then redis.call('HINCRBY', item.meta, 'dropped_stale', #item.forget) end
    if item.retired then
      redis.call('HSET', item.data, 'retired', item.retired)
      redis.call('HSET', item.meta, 'retired_count', string.format('%.17g', (struct.unpack('<d', item.retired, 1))))
    end
    redis.call('HSET', item.data, 'agg', item.agg, 'slot:' .. shard, item.payload)
    redis.call('HSET', item.meta, 'version', item.version, 'updated_at_us', now_s, 'writers', item.writers,
      'slot:' .. shard .. ':incarnation', inc, 'slot:' .. shard .. ':seq', seq, 'slot:' .. shard .. ':at_us', now_s,
      'slot:' .. shard .. ':count', string.format('%.17g', (struct.unpack('<d', item.payload, 1))),
      'count', string.format('%.17g', (struct.unpack('<d', item.agg, 1))))
  else
    redis.call('HSET', item.data, 'value', item.payload)
    redis.call('HSET', item.meta, 'version', item.version, 'updated_at_us', now_s, 'writer', shard,
      'writer_incarnation', inc)
  end
  versions[i] = item.version
end

fleet_version = math.max(fleet_version, tonumber(floor)) + 1
redis.call('HSET', KEYS[1], 'fleet_version', fleet_version, 'updated_at_us', now_s)
redis.call('HSET', KEYS[2], shard .. ':incarnation', inc, shard .. ':seq', seq, shard .. ':at_us', now_s)

local entry = {'XADD', KEYS[3], 'MAXLEN', '~', tonumber(meta[4]) or 1000, '*',
  'shard', shard, 'incarnation', inc, 'seq', seq, 'fleet_version', fleet_version}
for i = 1, nkeys do
  entry[#entry + 1] = 'report:' .. items[i].name
  entry[#entry + 1] = items[i].payload
end
redis.call(unpack(entry))
redis.call('PUBLISH', prefix .. 'versions', fleet_version)

local reply = {'applied', fleet_version, now_s}
for i = 1, nkeys do reply[3 + i] = versions[i] end
return reply
