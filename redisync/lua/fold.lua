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
-- ARGV[3 + 2i]       name of the i-th key; ARGV[4 + 2i] its payload, little-endian float64:
--                    a broadcast value, or a merge key's count || sum [|| sumsq]
-- returns {'applied', fleet_version, now_us, version_1, ..., version_k}
--       | {'duplicate', fleet_version}
--       | {'rejected', reason, key, detail}     (also appended to the dead-letter stream)
--
-- Idempotent: a retried call (same shard, incarnation and seq) returns 'duplicate'. The work is
-- O(payload): the merge aggregate is updated as (agg - old slot) + new slot, as semantics.py does.

local CHUNK = 128
local FMT = '<' .. string.rep('d', CHUNK)

local prefix = string.match(KEYS[1] or '', '^(redisync:{[^}]+}:)meta$')
if not prefix then
  return {'rejected', 'malformed', '', 'KEYS[1] is not a redisync meta key'}
end

local meta = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'max_report_bytes', 'stream_maxlen', 'dead_letter_maxlen')
local dead_maxlen = tonumber(meta[5]) or 10000
local shard, inc, seq = ARGV[2] or '', ARGV[3] or '', ARGV[4] or ''

local function reject(reason, key, detail)
  local entry = {'XADD', prefix .. 'dead', 'MAXLEN', '~', dead_maxlen, '*',
    'reason', reason, 'key', key, 'detail', detail, 'shard', shard, 'incarnation', inc, 'seq', seq}
  local budget = tonumber(meta[3]) or 1048576
  for i = 5, #ARGV, 2 do
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
local nkeys = (#ARGV - 4) / 2
if nkeys < 1 or nkeys ~= math.floor(nkeys) or #KEYS ~= 4 + 2 * nkeys then
  return reject('malformed', '', 'expected one (name, payload) pair per reported key and two KEYS per key')
end

-- duplicates, retries and zombies --------------------------------------------------------------
local function newer(a, b) -- decimal strings without leading zeros: is a > b?
  if #a ~= #b then return #a > #b end
  return a > b
end
local cur = redis.call('HMGET', KEYS[2], shard .. ':incarnation', shard .. ':seq')
local fleet_version = tonumber(redis.call('HGET', KEYS[1], 'fleet_version')) or 0
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

-- validate every key before writing anything (a report applies all or none) -----------------------
local total = 0
for i = 1, nkeys do total = total + #ARGV[4 + 2 * i] end
if total > (tonumber(meta[3]) or 0) then
  return reject('too_large', '', 'payload of ' .. total .. ' bytes exceeds max_report_bytes=' .. tostring(meta[3]))
end

local function chunks_of(payload, width, nonneg_upto, nonneg_from, name)
  -- decode the payload chunk by chunk, checking finiteness and the non-negative parts;
  -- returns the list of decoded chunks, or nil and the rejection
  local chunks, base, pos = {}, 0, 1
  while base < width do
    local len = math.min(CHUNK, width - base)
    local c = {struct.unpack(len == CHUNK and FMT or '<' .. string.rep('d', len), payload, pos)}
    for j = 1, len do
      local v = c[j]
      if v - v ~= 0 then
        return nil, {'non_finite', name, 'element ' .. (base + j - 1) .. ' is not finite'}
      end
      if v < 0 and (base + j <= nonneg_upto or base + j > nonneg_from) then
        return nil, {'negative', name, 'element ' .. (base + j - 1) .. ' is ' .. string.format('%.17g', v) ..
          ' in a count or sumsq part (must be >= 0)'}
      end
    end
    chunks[#chunks + 1] = c
    base = base + len
    pos = pos + len * 8
  end
  return chunks
end

local items, seen = {}, {}
for i = 1, nkeys do
  local name, payload = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  if seen[name] then return reject('malformed', name, 'key reported twice') end
  seen[name] = true
  if KEYS[3 + 2 * i] ~= prefix .. 'key:' .. name or KEYS[4 + 2 * i] ~= prefix .. 'data:' .. name then
    return reject('malformed', name, 'KEYS do not match the reported key names')
  end
  local spec = redis.call('HMGET', KEYS[3 + 2 * i], 'semantics', 'width', 'size', 'owner', 'stale_after_s')
  if not spec[1] then return reject('unknown_key', name, 'not declared in the run\'s schema') end
  local width = tonumber(spec[2])
  if #payload ~= width * 8 then
    return reject('shape', name, 'payload is ' .. #payload .. ' bytes, the key needs ' .. (width * 8) ..
      ' (' .. width .. ' float64)')
  end
  if spec[1] == 'broadcast' and spec[4] ~= '' and spec[4] ~= shard then
    return reject('not_owner', name, 'shard ' .. shard .. ' may not write a key owned by shard ' .. spec[4])
  end
  local chunks, why
  if spec[1] == 'merge' then
    local size = tonumber(spec[3])
    chunks, why = chunks_of(payload, width, size, 2 * size, name)  -- count and sumsq are non-negative
  else
    chunks, why = chunks_of(payload, width, 0, width, name)
  end
  if not chunks then return reject(why[1], why[2], why[3]) end
  items[i] = {name = name, payload = payload, chunks = chunks, width = width, semantics = spec[1],
    stale = tonumber(spec[5]), meta = KEYS[3 + 2 * i], data = KEYS[4 + 2 * i]}
end

-- apply ------------------------------------------------------------------------------------------
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)

local function combine(a, b, width, sign) -- bytes of a + sign * b
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = len == CHUNK and FMT or '<' .. string.rep('d', len)
    local x = {struct.unpack(fmt, a, pos)}
    local y = {struct.unpack(fmt, b, pos)}
    for j = 1, len do x[j] = x[j] + sign * y[j] end
    out[#out + 1] = struct.pack(fmt, unpack(x, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  return table.concat(out)
end

local function fold_in(agg, old, chunks, width) -- bytes of (agg - old) + new, or agg + new
  local out, pos, base = {}, 1, 0
  for k = 1, #chunks do
    local c = chunks[k]
    local len = math.min(CHUNK, width - base)
    local fmt = len == CHUNK and FMT or '<' .. string.rep('d', len)
    local a = {struct.unpack(fmt, agg, pos)}
    if old then
      local o = {struct.unpack(fmt, old, pos)}
      for j = 1, len do a[j] = (a[j] - o[j]) + c[j] end
    else
      for j = 1, len do a[j] = a[j] + c[j] end
    end
    out[k] = struct.pack(fmt, unpack(a, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  return table.concat(out)
end

local function ids_of(csv)
  local ids = {}
  for id in string.gmatch(csv or '', '%d+') do ids[#ids + 1] = tonumber(id) end
  table.sort(ids)
  return ids
end

local function forget_slot(item, id)
  redis.call('HDEL', item.meta, 'slot:' .. id .. ':incarnation', 'slot:' .. id .. ':seq',
    'slot:' .. id .. ':at_us', 'slot:' .. id .. ':count')
  redis.call('HDEL', item.data, 'slot:' .. id)
end

local function fold_merge(item)
  local agg = redis.call('HGET', item.data, 'agg')
  local old = redis.call('HGET', item.data, 'slot:' .. shard)
  local old_inc = redis.call('HGET', item.meta, 'slot:' .. shard .. ':incarnation')
  local writers = ids_of(redis.call('HGET', item.meta, 'writers'))
  local live = {}
  if old and old_inc ~= inc then
    -- the shard restarted: its previous life's statistics leave the slot
    if item.stale then
      agg = combine(agg, old, item.width, -1)
    else
      local retired = redis.call('HGET', item.data, 'retired')
      retired = retired and combine(retired, old, item.width, 1) or old
      redis.call('HSET', item.data, 'retired', retired)
      local rc = struct.unpack('<d', retired, 1)
      redis.call('HSET', item.meta, 'retired_count', string.format('%.17g', rc))
    end
    forget_slot(item, shard)
    old = false
  end
  for _, id in ipairs(writers) do
    local sid = tostring(id)
    if sid ~= shard and item.stale then
      local at = tonumber(redis.call('HGET', item.meta, 'slot:' .. sid .. ':at_us'))
      if now - at > item.stale * 1e6 then
        agg = combine(agg, redis.call('HGET', item.data, 'slot:' .. sid), item.width, -1)
        forget_slot(item, sid)
        redis.call('HINCRBY', item.meta, 'dropped_stale', 1)
      else
        live[#live + 1] = sid
      end
    elseif sid ~= shard then
      live[#live + 1] = sid
    end
  end
  live[#live + 1] = shard
  table.sort(live, function(a, b) return tonumber(a) < tonumber(b) end)
  agg = fold_in(agg, old or nil, item.chunks, item.width)
  redis.call('HSET', item.data, 'agg', agg, 'slot:' .. shard, item.payload)
  redis.call('HSET', item.meta, 'writers', table.concat(live, ','),
    'slot:' .. shard .. ':incarnation', inc, 'slot:' .. shard .. ':seq', seq,
    'slot:' .. shard .. ':at_us', now_s, 'slot:' .. shard .. ':count', string.format('%.17g', item.chunks[1][1]),
    'count', string.format('%.17g', struct.unpack('<d', agg, 1)))
end

local versions = {}
for i = 1, nkeys do
  local item = items[i]
  if item.semantics == 'merge' then
    fold_merge(item)
  else
    redis.call('HSET', item.data, 'value', item.payload)
    redis.call('HSET', item.meta, 'writer', shard, 'writer_incarnation', inc)
  end
  redis.call('HSET', item.meta, 'updated_at_us', now_s)
  versions[i] = redis.call('HINCRBY', item.meta, 'version', 1)
end

fleet_version = redis.call('HINCRBY', KEYS[1], 'fleet_version', 1)
redis.call('HSET', KEYS[1], 'updated_at_us', now_s)
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
