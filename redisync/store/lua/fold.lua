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
--                    a broadcast value, or a merge key's count || sum [|| sumsq]
-- returns {'applied', fleet_version, now_us, epoch, version_1, ..., version_k}
--       | {'duplicate', fleet_version}
--       | {'rejected', reason, key, detail}     (also appended to the dead-letter stream)
--
-- Every check, including those of the stored state the fold reads, runs before the first write.
-- A merge aggregate is recomputed from the live slots (retired history first, then the sums of the
-- groups of 16 shard ids in ascending order, each over its slots in ascending order), so its rounding
-- error is bounded by the live values, never by what once passed through a slot; semantics.py sums in
-- the same order. Idempotent: a retried call returns 'duplicate'.

local CHUNK = 128
local FMT = '<' .. string.rep('d', CHUNK)
local sunpack, spack = struct.unpack, struct.pack

local run = string.match(KEYS[1] or '', '^redisync:{([%w_%.:%-]+)}:meta$')
if not run or #run > 128 then
  return {'rejected', 'malformed', '', 'KEYS[1] is not a redisync meta key'}
end
local prefix = 'redisync:{' .. run .. '}:'

local meta = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'max_report_bytes', 'stream_maxlen', 'dead_letter_maxlen',
  'fleet_version', 'server', 'stream_payloads')
local shard, inc, seq, floor, resume = ARGV[2] or '', ARGV[3] or '', ARGV[4] or '', ARGV[5] or '', ARGV[6] or ''
-- a rejection for a run that does not exist writes nothing: no key of an unknown run is created
if not meta[1] then return {'rejected', 'no_run', '', 'the run is not registered (or the store lost it)'} end
local dead_maxlen = tonumber(meta[5]) or 10000

local function reject(reason, key, detail)
  local entry = {'XADD', prefix .. 'dead', 'MAXLEN', '~', dead_maxlen, '*',
    'reason', reason, 'key', key, 'detail', detail, 'shard', shard, 'incarnation', inc, 'seq', seq}
  local budget = tonumber(meta[3]) or 1048576
  for i = 7, #ARGV, 2 do
    local name, payload = ARGV[i], ARGV[i + 1] or ''
    if #payload > budget then payload = string.sub(payload, 1, budget); name = name .. ' (truncated)' end
    budget = budget - #payload
    entry[#entry + 1] = 'report:' .. name
    entry[#entry + 1] = payload
  end
  local kind = redis.call('TYPE', prefix .. 'dead')['ok']
  if kind ~= 'none' and kind ~= 'stream' then
    return {'rejected', reason, key, detail .. ' (not recorded: the dead-letter key is a ' .. kind .. ')'}
  end
  redis.call(unpack(entry))
  return {'rejected', reason, key, detail}
end

-- the envelope -------------------------------------------------------------------------------
if KEYS[2] ~= prefix .. 'shards' or KEYS[3] ~= prefix .. 'reports' or KEYS[4] ~= prefix .. 'dead' then
  return reject('malformed', '', 'KEYS[2..4] are not this run\'s shards, reports and dead-letter keys')
end
if ARGV[1] ~= meta[2] then
  return reject('schema_mismatch', '', 'the report was made against schema ' .. tostring(ARGV[1]) ..
    ', the run is registered with ' .. tostring(meta[2]))
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
local nkeys = (#ARGV - 6) / 2
if nkeys < 1 or nkeys ~= math.floor(nkeys) or #KEYS ~= 4 + 2 * nkeys then
  return reject('malformed', '', 'expected one (name, payload) pair per reported key and two KEYS per key')
end
if #resume ~= nkeys or string.find(resume, '[^01]') then
  return reject('malformed', '', 'ARGV[6] must hold one resume flag (0 or 1) per reported key')
end
for _, k in ipairs({KEYS[3], KEYS[4]}) do
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'none' and t ~= 'stream' then
    return {'rejected', 'corrupt_state', '', k .. ' is a ' .. t .. ', not a stream'}
  end
end
local fleet_version = tonumber(meta[6])
if not fleet_version then return reject('corrupt_state', '', 'the run\'s fleet_version is missing or not a number') end

-- duplicates, retries and zombies --------------------------------------------------------------
local function newer(a, b) -- decimal strings without leading zeros: is a > b?
  if #a ~= #b then return #a > #b end
  return a > b
end
local cur = redis.call('HMGET', KEYS[2], shard .. ':incarnation', shard .. ':seq')
if cur[1] then
  if newer(cur[1], inc) then
    return reject('stale_incarnation', '', 'incarnation ' .. inc .. ' is older than the shard\'s current ' .. cur[1])
  end
  if cur[1] == inc then
    local last = tonumber(cur[2]) or 0
    if tonumber(seq) == last then return {'duplicate', fleet_version} end
    if tonumber(seq) < last then
      return reject('seq_rollback', '', 'seq ' .. seq .. ' is below the last folded seq ' .. tostring(cur[2]))
    end
  end
end

local total = 0
for i = 1, nkeys do total = total + #ARGV[6 + 2 * i] end
if total > (tonumber(meta[3]) or 0) then
  return reject('too_large', '', 'payload of ' .. total .. ' bytes exceeds max_report_bytes=' .. tostring(meta[3]))
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_s = string.format('%.0f', now)

-- The server process: a fold by another process than the previous fold's (a restart, a failover)
-- may follow lost writes, so it opens a new epoch; every client then takes the whole state and
-- re-publishes, and no (epoch, version) pair ever names two states.
-- the server process (fakeredis, which has no INFO, is one process for ever; a user the ACL
-- denies INFO leaves the field as it is)
local info = redis.pcall('INFO', 'server')
local server = type(info) == 'string' and string.match(info, 'run_id:(%w+)') or
  (string.find(tostring(info['err']), 'unknown command') and 'embedded') or nil
local epoch = meta[1]
if server and meta[7] and meta[7] ~= '' and meta[7] ~= server then epoch = string.sub(server, 1, 8) .. '-' .. now_s end

-- vector helpers: vectors are decoded CHUNK values at a time ----------------------------------------
local function fmt_of(len)
  return len == CHUNK and FMT or '<' .. string.rep('d', len)
end

local function g17(v) return string.format('%.17g', v) end

-- Shards are summed in groups of GROUP consecutive ids, whose sums are stored ('group:<g>'): a fold
-- re-reads its own group's slots and the other groups' sums, not every slot of the fleet.
local GROUP = 16
local function group_of(id) return math.floor(tonumber(id) / GROUP) end

-- HMGET of any number of fields (unpack fails past ~8000 values)
local function hmget(key, fields)
  local out = {}
  for first = 1, #fields, 4096 do
    local got = redis.call('HMGET', key, unpack(fields, first, math.min(first + 4095, #fields)))
    for k = 1, #got do out[first + k - 1] = got[k] end
  end
  return out
end

-- Checks a new payload: finite everywhere, non-negative outside the signed part (signed_from, signed_to].
local function check_payload(name, payload, width, signed_from, signed_to)
  local pos, base = 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local c = {sunpack(fmt_of(len), payload, pos)}
    for k = 1, len do
      local v, g = c[k], base + k
      if v - v ~= 0 then return {'non_finite', name, 'element ' .. (g - 1) .. ' is not finite'} end
      if v < 0 and (g <= signed_from or g > signed_to) then
        return {'negative', name, 'element ' .. (g - 1) .. ' is ' .. g17(v) .. ' in a count or sumsq part (must be >= 0)'}
      end
    end
    base = base + len
    pos = pos + len * 8
  end
  return nil
end

-- ``0 + v1 + v2 + ...`` of payload strings, in order; ``check(a, base, len)``, if given, sees each
-- chunk of sums and may return a rejection, which ends the sum: returns (sum) or (nil, rejection).
local function summed(vectors, width, check)
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    local a = {}
    for k = 1, len do a[k] = 0.0 end
    for _, vec in ipairs(vectors) do
      local y = {sunpack(fmt, vec, pos)}
      for k = 1, len do a[k] = a[k] + y[k] end
    end
    if check then
      local why = check(a, base, len)
      if why then return nil, why end
    end
    out[#out + 1] = spack(fmt, unpack(a, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  return table.concat(out)
end

-- The sum of ``vectors`` (in order), and the rejection if it or the moments it implies are not finite.
-- count_size values of count, then size values of sum, then (sumsq) size values of sum of squares.
-- (A group's sum needs no check: a non-finite one makes the aggregate non-finite, which this refuses.)
local function sum_checked(name, vectors, width, count_size, size, sumsq)
  local counts = {}
  return summed(vectors, width, function(a, base, len)
    for k = 1, len do
      local v, g = a[k], base + k
      if v - v ~= 0 then return {'non_finite', name, 'the fleet aggregate would overflow at element ' .. (g - 1)} end
      if g <= count_size then
        counts[g] = v
      else
        -- element e of the sum (or sumsq) part: its count, and mean (or mean of squares) = v / count
        local e = (g - count_size - 1) % size
        local n = counts[count_size == 1 and 1 or e + 1]
        if n > 0 then
          local m = v / n
          if m - m ~= 0 or (g <= count_size + size and sumsq and (m * m) - (m * m) ~= 0) then
            return {'non_finite', name, 'the fleet moments would overflow at element ' .. e}
          end
        end
      end
    end
    return nil
  end)
end

-- The fused pass over one merge key's values ---------------------------------------------------------
-- The new group sums and the aggregate in one pass, BLOCK values at a time held in local variables:
-- each input decoded once per block (the payload serves both its checks and its slot), the sums
-- added in the order semantics.py adds them (a group: 0 + its slots in ascending shard order; the
-- aggregate: 0 + retired + the group sums in ascending group order), every check made on the same
-- block. A block whose cheap look (the sum of its squares finite; the signs of its count and sumsq
-- values) is not clean is checked element by element, in today's order, so replies stay bit for bit.
local BLOCK = 32
local FB = '<' .. string.rep('d', BLOCK)
local mmin = math.min

-- groups[i], in the order the aggregate adds them (the retired history first, as a stored vector):
-- {members = {slot string, or true for the payload}} (re-summed) or {stored = a stored vector};
-- returns (sums of the re-summed groups, aggregate) or (nil, rejection, it is the aggregate's)
local function fold_values(name, payload, width, cs, size, sumsq, groups)
  local ngroups = #groups
  local single = ngroups == 1 and groups[1].members ~= nil -- its sum is the aggregate
  local gout, aggs = {}, {}
  for gi = 1, ngroups do if groups[gi].members then gout[gi] = {} end end
  local counts, counts_ok = {}, true -- counts_ok: every count is 0 or >= 1 (moments then cannot overflow)

  local function count(idx) -- the aggregate's count idx, from the blocks made so far
    local n = counts[idx]
    if n == nil then
      n = sunpack('<d', aggs[math.floor((idx - 1) / BLOCK) + 1], ((idx - 1) % BLOCK) * 8 + 1)
      counts[idx] = n
    end
    return n
  end

  -- the first problem among elements base+1 .. base+len: a payload value's, else the aggregate's (true)
  local function check(base, len, p, c)
    for j = 1, len do
      local g, v, a = base + j, p[j], c[j]
      if v - v ~= 0 then return {'non_finite', name, 'element ' .. (g - 1) .. ' is not finite'} end
      if v < 0 and (g <= cs or g > cs + size) then
        return {'negative', name, 'element ' .. (g - 1) .. ' is ' .. g17(v) ..
          ' in a count or sumsq part (must be >= 0)'}
      end
      if a - a ~= 0 then return {'non_finite', name, 'the fleet aggregate would overflow at element ' .. (g - 1)},
        true end
      if g <= cs then
        counts[g] = a
        if a > 0 and a < 1 then counts_ok = false end
      else
        -- element e of the sum (or sumsq) part: its count, and mean (or mean of squares) = a / count
        local e = (g - cs - 1) % size
        local n = count(cs == 1 and 1 or e + 1)
        if n > 0 then
          local m = a / n
          if m - m ~= 0 or (g <= cs + size and sumsq and (m * m) - (m * m) ~= 0) then
            return {'non_finite', name, 'the fleet moments would overflow at element ' .. e}, true
          end
        end
      end
    end
    return nil
  end

  local pos, base, blk = 1, 0, 0
  while base + BLOCK <= width do
    blk = blk + 1
    local p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21,
      p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32 =
      sunpack(FB, payload, pos)
    local c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21,
      c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32 =
      0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for gi = 1, ngroups do
      local grp = groups[gi]
      local members = grp.members
      if members then
        local a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
          a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32 =
          0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        for mi = 1, #members do
          local s = members[mi]
          if s == true then
            a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
              a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32 =
              a1 + p1, a2 + p2, a3 + p3, a4 + p4, a5 + p5, a6 + p6, a7 + p7, a8 + p8, a9 + p9, a10 + p10,
                a11 + p11, a12 + p12, a13 + p13, a14 + p14, a15 + p15, a16 + p16, a17 + p17, a18 + p18,
                a19 + p19, a20 + p20, a21 + p21, a22 + p22, a23 + p23, a24 + p24, a25 + p25, a26 + p26,
                a27 + p27, a28 + p28, a29 + p29, a30 + p30, a31 + p31, a32 + p32
          else
            local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20,
              b21, b22, b23, b24, b25, b26, b27, b28, b29, b30, b31, b32 =
              sunpack(FB, s, pos)
            a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
              a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32 =
              a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7, a8 + b8, a9 + b9, a10 + b10,
                a11 + b11, a12 + b12, a13 + b13, a14 + b14, a15 + b15, a16 + b16, a17 + b17, a18 + b18,
                a19 + b19, a20 + b20, a21 + b21, a22 + b22, a23 + b23, a24 + b24, a25 + b25, a26 + b26,
                a27 + b27, a28 + b28, a29 + b29, a30 + b30, a31 + b31, a32 + b32
          end
        end
        local packed = spack(FB, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17,
          a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32)
        gout[gi][blk] = packed
        if single then
          c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21,
            c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32 =
            a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
              a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32
          aggs[blk] = packed
        else
          c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21,
            c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32 =
            c1 + a1, c2 + a2, c3 + a3, c4 + a4, c5 + a5, c6 + a6, c7 + a7, c8 + a8, c9 + a9, c10 + a10,
              c11 + a11, c12 + a12, c13 + a13, c14 + a14, c15 + a15, c16 + a16, c17 + a17, c18 + a18,
              c19 + a19, c20 + a20, c21 + a21, c22 + a22, c23 + a23, c24 + a24, c25 + a25, c26 + a26,
              c27 + a27, c28 + a28, c29 + a29, c30 + a30, c31 + a31, c32 + a32
        end
      else
        local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20, b21,
          b22, b23, b24, b25, b26, b27, b28, b29, b30, b31, b32 =
          sunpack(FB, grp.stored, pos)
        c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22,
          c23, c24, c25, c26, c27, c28, c29, c30, c31, c32 =
          c1 + b1, c2 + b2, c3 + b3, c4 + b4, c5 + b5, c6 + b6, c7 + b7, c8 + b8, c9 + b9, c10 + b10,
            c11 + b11, c12 + b12, c13 + b13, c14 + b14, c15 + b15, c16 + b16, c17 + b17, c18 + b18,
            c19 + b19, c20 + b20, c21 + b21, c22 + b22, c23 + b23, c24 + b24, c25 + b25, c26 + b26,
            c27 + b27, c28 + b28, c29 + b29, c30 + b30, c31 + b31, c32 + b32
      end
    end
    if not single then aggs[blk] = spack(FB, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14,
      c15, c16, c17, c18, c19, c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32) end
    -- the cheap look: finite squares mean finite values and, with counts of 0 or >= 1, finite moments
    local sq = c1 * c1 + c2 * c2 + c3 * c3 + c4 * c4 + c5 * c5 + c6 * c6 + c7 * c7 + c8 * c8 + c9 * c9
      + c10 * c10 + c11 * c11 + c12 * c12 + c13 * c13 + c14 * c14 + c15 * c15 + c16 * c16 + c17 * c17
      + c18 * c18 + c19 * c19 + c20 * c20 + c21 * c21 + c22 * c22 + c23 * c23 + c24 * c24 + c25 * c25
      + c26 * c26 + c27 * c27 + c28 * c28 + c29 * c29 + c30 * c30 + c31 * c31 + c32 * c32
    local slow = sq - sq ~= 0
    if not slow then
      if base < cs then -- count values: never negative; a fraction makes the moments' cheap look unsound
        if base + BLOCK > cs or mmin(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16,
          p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32) < 0 then
          slow = true
        elseif mmin(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19,
          c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32) < 1 then
          for _, n in ipairs({c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17,
            c18, c19, c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32}) do
            if n > 0 and n < 1 then counts_ok = false end
          end
        end
      elseif not counts_ok then
        slow = true -- counts that are fractions
      elseif base + BLOCK > cs + size and mmin(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14,
        p15, p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32) < 0 then
        slow = true -- sumsq values that may be negative
      end
    end
    if slow then
      local why, of_agg = check(base, BLOCK, {p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14,
        p15, p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32},
        {c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22,
          c23, c24, c25, c26, c27, c28, c29, c30, c31, c32})
      if why then return nil, why, of_agg end
    end
    base, pos = base + BLOCK, pos + BLOCK * 8
  end
  if base < width then -- the last values, fewer than a block, in tables
    local len = width - base
    local fmt = '<' .. string.rep('d', len)
    local p, c = {sunpack(fmt, payload, pos)}, {}
    for k = 1, len do c[k] = 0.0 end
    for gi = 1, ngroups do
      local grp = groups[gi]
      if grp.members then
        local a = {}
        for k = 1, len do a[k] = 0.0 end
        for _, s in ipairs(grp.members) do
          local y = s == true and p or {sunpack(fmt, s, pos)}
          for k = 1, len do a[k] = a[k] + y[k] end
        end
        gout[gi][blk + 1] = spack(fmt, unpack(a, 1, len))
        if single then c = a else for k = 1, len do c[k] = c[k] + a[k] end end
      else
        local y = {sunpack(fmt, grp.stored, pos)}
        for k = 1, len do c[k] = c[k] + y[k] end
      end
    end
    aggs[blk + 1] = single and gout[1][blk + 1] or spack(fmt, unpack(c, 1, len))
    local why, of_agg = check(base, len, p, c)
    if why then return nil, why, of_agg end
  end
  local sums = {}
  for gi = 1, ngroups do if gout[gi] then sums[gi] = table.concat(gout[gi]) end end
  return sums, table.concat(aggs)
end

-- validate and compute every key before writing anything (a report applies all or none) ------------
local items, seen = {}, {}
for i = 1, nkeys do
  local name, payload = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  local resumed = string.sub(resume, i, i) == '1'
  if seen[name] then return reject('malformed', name, 'key reported twice') end
  seen[name] = true
  local km, kd = KEYS[3 + 2 * i], KEYS[4 + 2 * i]
  if km ~= prefix .. 'key:' .. name or kd ~= prefix .. 'data:' .. name then
    return reject('malformed', name, 'KEYS do not match the reported key names')
  end
  for _, k in ipairs({km, kd}) do
    local kt = redis.call('TYPE', k)['ok']
    if kt ~= 'none' and kt ~= 'hash' then return reject('corrupt_state', name, k .. ' is a ' .. kt .. ', not a hash') end
  end
  local spec = redis.call('HMGET', km, 'semantics', 'width', 'count_size', 'owner', 'stale_after_s', 'version', 'writers',
    'slot:' .. shard .. ':incarnation', 'size', 'lifecycle', 'sumsq')
  if not spec[1] then return reject('unknown_key', name, 'not declared in the run\'s schema') end
  local width, version = tonumber(spec[2]), tonumber(spec[6])
  if not width or not version then return reject('corrupt_state', name, 'the key\'s width or version is missing') end
  if #payload ~= width * 8 then
    return reject('shape', name, 'payload is ' .. #payload .. ' bytes, the key needs ' .. (width * 8) ..
      ' (' .. width .. ' float64)')
  end
  local item = {name = name, payload = payload, semantics = spec[1], meta = km, data = kd, version = version + 1}
  if spec[1] == 'broadcast' then
    if spec[4] ~= '' and spec[4] ~= shard then
      return reject('not_owner', name, 'shard ' .. shard .. ' may not write a key owned by shard ' .. tostring(spec[4]))
    end
    local why = check_payload(name, payload, width, 0, width)
    if why then return reject(why[1], why[2], why[3]) end
  elseif spec[1] == 'merge' then
    local count_size, size = tonumber(spec[3]), tonumber(spec[9])
    if not count_size or not size then return reject('corrupt_state', name, 'the key\'s count_size or size is missing') end
    -- the payload's values are checked in the fused pass; a refusal before it names their problem first
    local function refuse(reason, key, detail)
      local why = check_payload(name, payload, width, count_size, count_size + size)
      if why then return reject(why[1], why[2], why[3]) end
      return reject(reason, key, detail)
    end
    local stale = tonumber(spec[5])
    -- the other live writers, in ascending order, and (stale keys) when each last wrote
    local ids, was_writer = {}, false
    for id in string.gmatch(spec[7] or '', '[^,]+') do
      if not string.match(id, '^%d+$') then return refuse('corrupt_state', name, 'writers holds ' .. string.format('%q', id)) end
      if id ~= shard then ids[#ids + 1] = id else was_writer = true end
    end
    table.sort(ids, function(a, b) return tonumber(a) < tonumber(b) end)
    local at = {}
    if stale and #ids > 0 then
      local atf = {}
      for k, id in ipairs(ids) do atf[k] = 'slot:' .. id .. ':at_us' end
      at = hmget(km, atf)
    end
    local data = redis.call('HMGET', kd, 'retired', 'slot:' .. shard)
    local retired, old = data[1], data[2]
    for k, field in ipairs({'retired', 'slot:' .. shard}) do
      if data[k] and #data[k] ~= width * 8 then
        return refuse('corrupt_state', name, 'stored ' .. field .. ' is ' .. #data[k] .. ' bytes, the key needs ' .. (width * 8))
      end
    end
    if old and spec[8] ~= inc and not resumed then
      -- a new incarnation that did not resume: the previous life is history (retired) or a state (dropped)
      if spec[10] ~= 'state' then
        if retired then
          local sum, e = sum_checked(name, {retired, old}, width, count_size, size, spec[11] == '1')
          if not sum then return refuse(e[1], e[2], e[3]) end
          retired = sum
        else
          retired = old
        end
        item.retired = retired
      end
    end
    -- the live slots after this fold (a slot not refreshed for stale_after_s stops weighting the
    -- fleet), by group of GROUP shard ids; the groups whose members change are recomputed
    item.forget = {}
    local live, touched = {}, {[group_of(shard)] = true}
    local mine_added = false
    for k, id in ipairs(ids) do
      if not mine_added and tonumber(id) > tonumber(shard) then live[#live + 1] = shard; mine_added = true end
      if stale and now - (tonumber(at[k]) or 0) > stale * 1e6 then
        item.forget[#item.forget + 1] = id
        touched[group_of(id)] = true
      else
        live[#live + 1] = id
      end
    end
    if not mine_added then live[#live + 1] = shard end
    item.writers = table.concat(live, ',')
    local members, order = {}, {}
    for _, id in ipairs(live) do
      local g = group_of(id)
      if not members[g] then members[g] = {}; order[#order + 1] = g end
      members[g][#members[g] + 1] = id
    end
    local gfields = {}
    for k, g in ipairs(order) do gfields[k] = 'group:' .. g end
    local stored = hmget(kd, gfields)
    -- a group is recomputed from its slots when touched, or when its sum is missing (a run restored
    -- from a snapshot taken before groups existed)
    local wanted, fields = {}, {}
    for k, g in ipairs(order) do
      if touched[g] or not stored[k] then
        for _, id in ipairs(members[g]) do
          if id ~= shard then wanted[#wanted + 1] = id; fields[#fields + 1] = 'slot:' .. id end
        end
      end
    end
    for _, id in ipairs(item.forget) do wanted[#wanted + 1] = id; fields[#fields + 1] = 'slot:' .. id end
    local slots = {[shard] = payload}
    local got = hmget(kd, fields)
    for k, id in ipairs(wanted) do
      local v = got[k]
      if not v then return refuse('corrupt_state', name, 'writer ' .. id .. ' has no stored slot') end
      if #v ~= width * 8 then
        return refuse('corrupt_state', name, 'stored slot:' .. id .. ' is ' .. #v .. ' bytes, the key needs ' .. (width * 8))
      end
      slots[id] = v
    end
    -- the group sums to re-make and the aggregate, in one pass: the retired history, then the group
    -- sums in ascending group order, each the sum of its live slots in ascending shard order
    -- (semantics.py sums in the same order)
    local groups, fresh = {}, {}
    if retired then groups[1] = {stored = retired} end
    local first = #groups -- groups[first + k] is the k-th group in order
    for k, g in ipairs(order) do
      local sum = stored[k]
      if sum and touched[g] and #sum == width * 8 then
        -- the stored sum is re-made from this group's slots: it must have been their sum before this
        -- fold (checked on the counts, which costs count_size values per slot)
        local prior, own = {}, was_writer and old and group_of(shard) == g
        for _, id in ipairs(ids) do
          if group_of(id) == g then
            if own and tonumber(id) > tonumber(shard) then prior[#prior + 1] = old; own = false end
            prior[#prior + 1] = slots[id]
          end
        end
        if own then prior[#prior + 1] = old end
        -- summed over the first count_size values: the same operations, so the same bits
        if summed(prior, count_size) ~= string.sub(sum, 1, 8 * count_size) then
          return refuse('corrupt_state', name, 'stored ' .. gfields[k] .. ' disagrees with the sum of its slots')
        end
      end
      if touched[g] or not sum then
        local vs = {}
        for _, id in ipairs(members[g]) do vs[#vs + 1] = id == shard or slots[id] end
        groups[first + k], fresh[#fresh + 1] = {members = vs}, k
      elseif #sum ~= width * 8 then
        return refuse('corrupt_state', name, 'stored ' .. gfields[k] .. ' is ' .. #sum .. ' bytes, the key needs ' ..
          (width * 8))
      else
        groups[first + k] = {stored = sum}
      end
    end
    local sums, agg, of_agg = fold_values(name, payload, width, count_size, size, spec[11] == '1', groups)
    if not sums then
      if of_agg then return refuse(agg[1], agg[2], agg[3]) end
      return reject(agg[1], agg[2], agg[3])
    end
    item.groups, item.emptied = {}, {}
    for _, k in ipairs(fresh) do
      item.groups[#item.groups + 1] = gfields[k]
      item.groups[#item.groups + 1] = sums[first + k]
    end
    for g in pairs(touched) do
      if not members[g] then item.emptied[#item.emptied + 1] = 'group:' .. g end
    end
    item.agg = agg
  else
    return reject('corrupt_state', name, 'unknown semantics ' .. string.format('%q', spec[1]))
  end
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
      redis.call('HSET', item.meta, 'retired_count', g17((struct.unpack('<d', item.retired, 1))))
    end
    if #item.emptied > 0 then redis.call('HDEL', item.data, unpack(item.emptied)) end
    redis.call('HSET', item.data, 'agg', item.agg, 'slot:' .. shard, item.payload, unpack(item.groups))
    redis.call('HSET', item.meta, 'version', item.version, 'updated_at_us', now_s, 'writers', item.writers,
      'slot:' .. shard .. ':incarnation', inc, 'slot:' .. shard .. ':seq', seq, 'slot:' .. shard .. ':at_us', now_s,
      'slot:' .. shard .. ':count', g17((struct.unpack('<d', item.payload, 1))),
      'count', g17((struct.unpack('<d', item.agg, 1))))
  else
    redis.call('HSET', item.data, 'value', item.payload)
    redis.call('HSET', item.meta, 'version', item.version, 'updated_at_us', now_s, 'writer', shard,
      'writer_incarnation', inc)
  end
  versions[i] = item.version
end

fleet_version = math.max(fleet_version, tonumber(floor)) + 1
redis.call('HSET', KEYS[1], 'fleet_version', fleet_version, 'updated_at_us', now_s, 'epoch', epoch,
  'server', server or meta[7] or '')
redis.call('HSET', KEYS[2], shard .. ':incarnation', inc, shard .. ':seq', seq, shard .. ':at_us', now_s)

local entry = {'XADD', KEYS[3], 'MAXLEN', '~', tonumber(meta[4]) or 1000, '*',
  'shard', shard, 'incarnation', inc, 'seq', seq, 'fleet_version', fleet_version}
for i = 1, nkeys do
  -- the envelope names every key; the payloads themselves only for a run that asked (stream_payloads)
  entry[#entry + 1] = 'report:' .. items[i].name
  entry[#entry + 1] = meta[8] == '1' and items[i].payload or #items[i].payload .. ' bytes'
end
redis.call(unpack(entry))
redis.call('PUBLISH', prefix .. 'versions', fleet_version)

local reply = {'applied', fleet_version, now_s, epoch}
for i = 1, nkeys do reply[4 + i] = versions[i] end
return reply
