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
-- returns {'applied', fleet_version, now_us, epoch, version_1, ..., version_k}, and announces
--         '<fleet_version> <epoch>' on the run's versions channel
--       | {'duplicate', fleet_version}
--       | {'rejected', reason, key, detail}     (also appended to the dead-letter stream)
--
-- Every check, including those of the stored state the fold reads, runs before the first write.
-- A merge aggregate is recomputed from the live slots (retired history first, then the sums of the
-- groups of 16 shard ids in ascending order, each over its 4 sub-groups of 4 ids in ascending order,
-- each over its slots in ascending order), so its rounding error is bounded by the live values, never
-- by what once passed through a slot; semantics.py sums in the same order. Idempotent: a retried call
-- returns 'duplicate'.

-- (the library's function redisync_fold_<version>, see library.py: KEYS and ARGV are the FCALL's keys and arguments)

-- (string constants are made once, when the library is loaded; a string made at run time costs its length)
local CHUNK = 32
local FMT = '<dddddddddddddddddddddddddddddddd'
local sunpack, spack -- struct's unpack and pack, taken at the first call (see struct_library)

-- One fold's own state. fold() sets it at the start of each call and the helpers below read it:
-- they are made once, when the library loads, not at every call (a closure costs ~500 instructions
-- per variable it captures each time it is made), and the server runs one call at a time.
local KEYS, ARGV, run, meta, shard, inc, seq, floor, resume
local nkeys, fleet_version, cur, now_s, now, server, epoch, limits
local served, stalled_s -- the run's served clock at this fold (clock.lua), and clock_stalled_us's new text
local clock_read -- whether this fold read the clock (only a fold of a key with a lease grace needs it)

-- The run's served clock at this fold, read at its first use: a fold of keys without a lease grace
-- (history keys) neither reads nor advances it (the leases' renewals and the folds of state keys do).
local function run_clock()
  if not clock_read then
    local c = redis.call('HMGET', KEYS[1], 'clock_wall_us', 'clock_stalled_us')
    served, stalled_s = served_clock(c[1], c[2], now, meta[3])
    clock_read = true
  end
  return served
end
local own -- the folding shard's field names (see shard_fields)

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

local function reject(reason, key, detail)
  -- capped in entries and in bytes: an entry keeps at most dead_letter_max_bytes / dead_letter_maxlen
  -- bytes of the refused report's payloads
  local maxlen = limits.dead_letter_maxlen
  local entry = {'XADD', run.dead, 'MAXLEN', '~', maxlen, '*',
    'reason', reason, 'key', key, 'detail', detail, 'shard', shard, 'incarnation', inc, 'seq', seq}
  local budget = math.min(limits.max_report_bytes, math.floor(limits.dead_letter_max_bytes / maxlen))
  for i = 7, #ARGV, 2 do
    local name, payload = ARGV[i], ARGV[i + 1] or ''
    if #payload > budget then payload = string.sub(payload, 1, budget); name = name .. ' (truncated)' end
    budget = budget - #payload
    entry[#entry + 1] = 'report:' .. name
    entry[#entry + 1] = payload
  end
  local kind = redis.call('TYPE', run.dead)['ok']
  if kind ~= 'none' and kind ~= 'stream' then
    return {'rejected', reason, key, detail .. ' (not recorded: the dead-letter key is a ' .. kind .. ')'}
  end
  redis.call(unpack(entry))
  return {'rejected', reason, key, detail}
end

local function newer(a, b) -- decimal strings without leading zeros: is a > b?
  if #a ~= #b then return #a > #b end
  return a > b
end

-- vector helpers: vectors are decoded CHUNK values at a time ----------------------------------------
local function fmt_of(len)
  return len == CHUNK and FMT or '<' .. string.rep('d', len)
end

local function g17(v) return string.format('%.17g', v) end

-- Live slots are summed in two levels of stored sums: a sub-group of SUB consecutive shard ids
-- ('sub:<q>', q = id // SUB) and a group of SUBS sub-groups ('group:<g>', g = q // SUBS). A fold
-- re-reads its own sub-group's slots, the other sub-groups' sums of its group and the other groups'
-- sums: at 64 live slots 3 slots, 3 sub-group and 3 group sums, not 15 slots. A lone sum (the only
-- sub-group of its group, the only term of the aggregate) equals the sum it is part of and is not
-- stored; one found missing is re-made from its parts. A key whose sums were laid out otherwise
-- (sums_layout, written by the fold) has every sum re-made from its slots.
-- BEGIN GENERATED constants
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local SUB, SUBS = 4, 4
local LAYOUT = '4/16/lone'
-- END GENERATED constants
local mfloor = math.floor
local NONE = {} -- an empty table read where nothing was read into one (never written)

-- One string of many pieces. Redis' Lua hashes every byte of every string it makes, so a string
-- costs its length each time one is made: table.concat makes each byte several times over (its
-- buffer merges pieces in steps), one `..` of many operands makes it once.
-- BEGIN GENERATED join64
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local function join64(t, i)
  return
    (t[i] or '') .. (t[i + 1] or '') .. (t[i + 2] or '') .. (t[i + 3] or '') .. (t[i + 4] or '') ..
    (t[i + 5] or '') .. (t[i + 6] or '') .. (t[i + 7] or '') .. (t[i + 8] or '') .. (t[i + 9] or '') ..
    (t[i + 10] or '') .. (t[i + 11] or '') .. (t[i + 12] or '') .. (t[i + 13] or '') .. (t[i + 14] or '') ..
    (t[i + 15] or '') .. (t[i + 16] or '') .. (t[i + 17] or '') .. (t[i + 18] or '') .. (t[i + 19] or '') ..
    (t[i + 20] or '') .. (t[i + 21] or '') .. (t[i + 22] or '') .. (t[i + 23] or '') .. (t[i + 24] or '') ..
    (t[i + 25] or '') .. (t[i + 26] or '') .. (t[i + 27] or '') .. (t[i + 28] or '') .. (t[i + 29] or '') ..
    (t[i + 30] or '') .. (t[i + 31] or '') .. (t[i + 32] or '') .. (t[i + 33] or '') .. (t[i + 34] or '') ..
    (t[i + 35] or '') .. (t[i + 36] or '') .. (t[i + 37] or '') .. (t[i + 38] or '') .. (t[i + 39] or '') ..
    (t[i + 40] or '') .. (t[i + 41] or '') .. (t[i + 42] or '') .. (t[i + 43] or '') .. (t[i + 44] or '') ..
    (t[i + 45] or '') .. (t[i + 46] or '') .. (t[i + 47] or '') .. (t[i + 48] or '') .. (t[i + 49] or '') ..
    (t[i + 50] or '') .. (t[i + 51] or '') .. (t[i + 52] or '') .. (t[i + 53] or '') .. (t[i + 54] or '') ..
    (t[i + 55] or '') .. (t[i + 56] or '') .. (t[i + 57] or '') .. (t[i + 58] or '') .. (t[i + 59] or '') ..
    (t[i + 60] or '') .. (t[i + 61] or '') .. (t[i + 62] or '') .. (t[i + 63] or '')
end
-- END GENERATED join64
local function join(t)
  local n = #t
  if n <= 1 then return t[1] or '' end
  if n == 2 then return t[1] .. t[2] end
  if n == 3 then return t[1] .. t[2] .. t[3] end
  local out = {}
  for i = 1, #t, 64 do out[#out + 1] = join64(t, i) end
  return join(out)
end

-- HMGET of any number of fields (unpack fails past ~8000 values): fields[1 .. n], n = #fields unless
-- given; nil if the key is not a hash
local function hmget(key, fields, n)
  n = n or #fields
  if n <= 4096 then
    local got = redis.pcall('HMGET', key, unpack(fields, 1, n))
    return not got['err'] and got or nil
  end
  local out = {}
  for first = 1, n, 4096 do
    local got = redis.pcall('HMGET', key, unpack(fields, first, math.min(first + 4095, n)))
    if got['err'] then return nil end
    for k = 1, #got do out[first + k - 1] = got[k] end
  end
  return out
end

local function not_hash(key) return key .. ' is a ' .. redis.call('TYPE', key)['ok'] .. ', not a hash' end

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

-- A refusal of a merge key before its fused pass: the payload's own problem, if it has one, first.
-- (key: the key's item, with its name, payload, width, count_size and size. The fold's helpers take
-- what they use as arguments, made once here: a closure costs ~500 instructions per variable it
-- captures, each time it is made.)
local function refuse(key, reason, detail)
  local why = check_payload(key.name, key.payload, key.width, key.count_size, key.count_size + key.size)
  if why then return reject(why[1], why[2], why[3]) end
  return reject(reason, key.name, detail)
end

-- The decimal name of a small whole number (a sub-group's, a group's), made once per Lua VM: Lua
-- makes a string of a number with a float printf, a library's upvalues outlive the call.
local DECIMAL = {}
local function decimal(n)
  local s = DECIMAL[n]
  if not s then
    s = string.format('%d', n)
    if n < 65536 then DECIMAL[n] = s end
  end
  return s
end

-- cache[key], made by make(key) the first time: the decimal names of numbers (Lua makes a string of
-- a number with a printf), the joined string of blocks that several sums share
local function once(cache, key, make)
  local s = cache[key]
  if not s then s = make(key); cache[key] = s end
  return s
end

-- What a fold reads of a data hash: plan.n fields, with the length each must have and the writer
-- whose slot it is; fetch reads them into plan.got (and the slots into plan.slots), checked.
local function ask(plan, field, len, id)
  local n = plan.n + 1
  plan.n = n
  plan.fields[n], plan.sizes[n], plan.owners[n] = field, len, id or false
end

local function ask_slots(plan, live, from, to, me, idname, len) -- the slots of live[from .. to]
  for k = from, to do
    local id = live[k]
    if id ~= me then ask(plan, 'slot:' .. idname[id], len, id) end
  end
end

local function fetch(plan, key, idname) -- nil, or the rejection
  local fields, sizes, owners, got, slots = plan.fields, plan.sizes, plan.owners, plan.got, plan.slots
  local values = hmget(key.data, fields, plan.n)
  if not values then return refuse(key, 'corrupt_state', not_hash(key.data)) end
  for k = 1, plan.n do
    local v, field = values[k], fields[k]
    got[field] = v
    if v and #v ~= sizes[k] then
      return refuse(key, 'corrupt_state', 'stored ' .. field .. ' is ' .. #v .. ' bytes, the key needs ' .. sizes[k])
    end
    local id = owners[k]
    if id then
      if not v then return refuse(key, 'corrupt_state', 'writer ' .. idname[id] .. ' has no stored slot') end
      slots[id] = v
    end
  end
  plan.n = 0 -- (the next read's fields overwrite these: the tables are made once per fold)
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
  return join(out)
end

-- ``0 + v1 + v2 + ...`` over the first count_size values of each vector, packed (the count parts)
local function count_sum(vectors, count_size)
  if count_size ~= 1 then return summed(vectors, count_size) end
  local s = 0.0
  for k = 1, #vectors do s = s + sunpack('<d', vectors[k]) end
  return spack('<d', s)
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
-- The re-made sums and the aggregate in one pass, BLOCK values at a time held in local variables:
-- each input decoded once per block (the payload serves both its checks and its slot), the sums
-- added in the order semantics.py adds them (a sub-group: 0 + its slots in ascending shard order; a
-- group: 0 + its sub-groups' sums in ascending order; the aggregate: 0 + retired + the group sums in
-- ascending order), every check made on the same block. A block whose cheap look (the sum of its
-- squares finite; the signs of its count and sumsq values) is not clean is checked element by
-- element, in payload order, so replies stay bit for bit.
local BLOCK = CHUNK
local FB = FMT
local mmin = math.min


-- The checks of the elements of one stretch of values, for a block whose cheap look is not clean:
-- st holds the key (name, cs, size, sumsq), the aggregate's blocks made so far (aggs), the counts seen
-- (counts) and whether every count is 0 or >= 1 (ok: the moments then cannot overflow). (Functions
-- made once, at the top: a closure costs about 500 instructions per variable it captures.)
local function agg_count(st, idx) -- the aggregate's count idx, from the blocks made so far
  local n = st.counts[idx]
  if n == nil then -- (the head's counts are all in st.counts: it is checked element by element)
    local k = idx - st.head - 1
    n = sunpack('<d', st.aggs[mfloor(k / BLOCK) + (st.head > 0 and 2 or 1)], (k % BLOCK) * 8 + 1)
    st.counts[idx] = n
  end
  return n
end

-- the first problem among elements base+1 .. base+len: a payload value's, else the aggregate's (true)
local function check(st, base, len, p, c)
  local name, cs, size, sumsq, counts = st.name, st.cs, st.size, st.sumsq, st.counts
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
      if a > 0 and a < 1 then st.ok = false end
    else
      -- element e of the sum (or sumsq) part: its count, and mean (or mean of squares) = a / count
      local e = (g - cs - 1) % size
      local n = agg_count(st, cs == 1 and 1 or e + 1)
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

-- The head: the first len values (fewer than a block) in tables, made piece 1 of every sum; nil or
-- the rejection. (The stretch that is not a whole number of blocks comes first, where a merge key's
-- single count sits: a width of 1 + 32k then makes k whole blocks.)
local function zeros(len) local z = {} for k = 1, len do z[k] = 0.0 end return z end
local function add_to(x, y, len) for k = 1, len do x[k] = x[k] + y[k] end end
local function fold_head(st, payload, tree, single, len)
  local fmt = '<' .. string.rep('d', len)
  local p, c = {sunpack(fmt, payload, 1)}, zeros(len)
  for ti = 1, #tree do
    local term = tree[ti]
    if term.parts then
      local g, packed = zeros(len), nil
      for _, part in ipairs(term.parts) do
        if part.members then
          local a = zeros(len)
          for _, s in ipairs(part.members) do add_to(a, s == true and p or {sunpack(fmt, s, 1)}, len) end
          packed = spack(fmt, unpack(a, 1, len))
          part.out[1] = packed
          if term.lone then g = a else add_to(g, a, len) end
        else
          add_to(g, {sunpack(fmt, part.stored, 1)}, len)
        end
      end
      if not term.lone then packed = spack(fmt, unpack(g, 1, len)) end
      term.out[1] = packed
      if single then c = g else add_to(c, g, len) end
    else
      add_to(c, {sunpack(fmt, term.stored, 1)}, len)
    end
  end
  st.aggs[1] = single and tree[1].out[1] or spack(fmt, unpack(c, 1, len))
  return check(st, 0, len, p, c)
end

-- The head of one value (a merge key with one count and a size that is a whole number of blocks:
-- the usual layout), as fold_head makes it, in scalars: the same additions in the same order, no
-- table per sum.
local function fold_head1(st, payload, tree, single)
  local p, c = sunpack('<d', payload, 1), 0.0
  for ti = 1, #tree do
    local term = tree[ti]
    local parts = term.parts
    if parts then
      local g, packed = 0.0, nil
      for pi = 1, #parts do
        local part = parts[pi]
        local members = part.members
        if members then
          local a = 0.0
          for mi = 1, #members do
            local s = members[mi]
            if s == true then a = a + p else a = a + sunpack('<d', s, 1) end
          end
          packed = spack('<d', a)
          part.out[1] = packed
          if term.lone then g = a else g = g + a end
        else
          g = g + sunpack('<d', part.stored, 1)
        end
      end
      if not term.lone then packed = spack('<d', g) end
      term.out[1] = packed
      if single then c = g else c = c + g end
    else
      c = c + sunpack('<d', term.stored, 1)
    end
  end
  st.aggs[1] = single and tree[1].out[1] or spack('<d', c)
  if st.cs == 1 and not (p - p ~= 0 or p < 0 or c - c ~= 0) then -- the count, clean: what check would record
    st.counts[1] = c
    if c > 0 and c < 1 then st.ok = false end
    return nil
  end
  return check(st, 0, 1, {p}, {c})
end

-- tree: the aggregate's terms in order, each {stored = a vector} or a group re-made from its parts
-- {parts = {...}, out = {}}, each part {stored = a vector} or a sub-group re-made from its slots
-- {members = {slot string, or true for the payload}, out = {}}; a re-made sum's blocks go to its out,
-- and the sum itself to its field sum. Returns the aggregate, or (nil, rejection, whether it is the
-- aggregate's).
-- (0 + x is x for every sum made here, which starts at +0: a lone part is its group's sum, a lone
-- group the aggregate.)
-- BEGIN GENERATED fold_values
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local function fold_values(name, payload, width, cs, size, sumsq, tree)
  local nterms = #tree
  local single = nterms == 1 and tree[1].parts ~= nil -- its sum is the aggregate
  for ti = 1, nterms do
    local parts = tree[ti].parts
    if parts then
      tree[ti].lone = #parts == 1 and parts[1].members ~= nil
      if tree[ti].lone then tree[ti].out = parts[1].out end -- the same blocks, made into one string once
    end
  end
  local aggs = single and tree[1].out or {}
  local counts = {}
  local head = width % BLOCK
  local st = {name = name, cs = cs, size = size, sumsq = sumsq, counts = counts, aggs = aggs, ok = true, head = head}
  if head == 1 then
    local why, of_agg = fold_head1(st, payload, tree, single)
    if why then return nil, why, of_agg end
  elseif head > 0 then
    local why, of_agg = fold_head(st, payload, tree, single, head)
    if why then return nil, why, of_agg end
  end
  local pos, base, blk = head * 8 + 1, head, head > 0 and 1 or 0
  while base < width do
    blk = blk + 1
    local p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21, p22, p23,
      p24, p25, p26, p27, p28, p29, p30, p31, p32 =
      sunpack(FB, payload, pos)
    local c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23,
      c24, c25, c26, c27, c28, c29, c30, c31, c32 =
      0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
        0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    for ti = 1, nterms do
      local term = tree[ti]
      local parts = term.parts
      if parts then
        local r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, r16, r17, r18, r19, r20, r21, r22,
          r23, r24, r25, r26, r27, r28, r29, r30, r31, r32 =
          0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
            0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        local packed
        for pi = 1, #parts do
          local part = parts[pi]
          local members = part.members
          if members then
            local a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
              a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32 =
              0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            for mi = 1, #members do
              local s = members[mi]
              if s == true then
                a1 = a1 + p1 a2 = a2 + p2 a3 = a3 + p3 a4 = a4 + p4 a5 = a5 + p5 a6 = a6 + p6 a7 = a7 + p7
                a8 = a8 + p8 a9 = a9 + p9 a10 = a10 + p10 a11 = a11 + p11 a12 = a12 + p12 a13 = a13 + p13
                a14 = a14 + p14 a15 = a15 + p15 a16 = a16 + p16 a17 = a17 + p17 a18 = a18 + p18 a19 = a19 + p19
                a20 = a20 + p20 a21 = a21 + p21 a22 = a22 + p22 a23 = a23 + p23 a24 = a24 + p24 a25 = a25 + p25
                a26 = a26 + p26 a27 = a27 + p27 a28 = a28 + p28 a29 = a29 + p29 a30 = a30 + p30 a31 = a31 + p31
                a32 = a32 + p32
              else
                local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20,
                  b21, b22, b23, b24, b25, b26, b27, b28, b29, b30, b31, b32 =
                  sunpack(FB, s, pos)
                a1 = a1 + b1 a2 = a2 + b2 a3 = a3 + b3 a4 = a4 + b4 a5 = a5 + b5 a6 = a6 + b6 a7 = a7 + b7
                a8 = a8 + b8 a9 = a9 + b9 a10 = a10 + b10 a11 = a11 + b11 a12 = a12 + b12 a13 = a13 + b13
                a14 = a14 + b14 a15 = a15 + b15 a16 = a16 + b16 a17 = a17 + b17 a18 = a18 + b18 a19 = a19 + b19
                a20 = a20 + b20 a21 = a21 + b21 a22 = a22 + b22 a23 = a23 + b23 a24 = a24 + b24 a25 = a25 + b25
                a26 = a26 + b26 a27 = a27 + b27 a28 = a28 + b28 a29 = a29 + b29 a30 = a30 + b30 a31 = a31 + b31
                a32 = a32 + b32
              end
            end
            packed =
              spack(FB, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
                a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32)
            part.out[blk] = packed
            if term.lone then
              r1 = a1 r2 = a2 r3 = a3 r4 = a4 r5 = a5 r6 = a6 r7 = a7 r8 = a8 r9 = a9 r10 = a10 r11 = a11 r12 = a12
              r13 = a13 r14 = a14 r15 = a15 r16 = a16 r17 = a17 r18 = a18 r19 = a19 r20 = a20 r21 = a21 r22 = a22
              r23 = a23 r24 = a24 r25 = a25 r26 = a26 r27 = a27 r28 = a28 r29 = a29 r30 = a30 r31 = a31 r32 = a32
            else
              r1 = r1 + a1 r2 = r2 + a2 r3 = r3 + a3 r4 = r4 + a4 r5 = r5 + a5 r6 = r6 + a6 r7 = r7 + a7
              r8 = r8 + a8 r9 = r9 + a9 r10 = r10 + a10 r11 = r11 + a11 r12 = r12 + a12 r13 = r13 + a13
              r14 = r14 + a14 r15 = r15 + a15 r16 = r16 + a16 r17 = r17 + a17 r18 = r18 + a18 r19 = r19 + a19
              r20 = r20 + a20 r21 = r21 + a21 r22 = r22 + a22 r23 = r23 + a23 r24 = r24 + a24 r25 = r25 + a25
              r26 = r26 + a26 r27 = r27 + a27 r28 = r28 + a28 r29 = r29 + a29 r30 = r30 + a30 r31 = r31 + a31
              r32 = r32 + a32
            end
          else
            local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20, b21,
              b22, b23, b24, b25, b26, b27, b28, b29, b30, b31, b32 =
              sunpack(FB, part.stored, pos)
            r1 = r1 + b1 r2 = r2 + b2 r3 = r3 + b3 r4 = r4 + b4 r5 = r5 + b5 r6 = r6 + b6 r7 = r7 + b7 r8 = r8 + b8
            r9 = r9 + b9 r10 = r10 + b10 r11 = r11 + b11 r12 = r12 + b12 r13 = r13 + b13 r14 = r14 + b14
            r15 = r15 + b15 r16 = r16 + b16 r17 = r17 + b17 r18 = r18 + b18 r19 = r19 + b19 r20 = r20 + b20
            r21 = r21 + b21 r22 = r22 + b22 r23 = r23 + b23 r24 = r24 + b24 r25 = r25 + b25 r26 = r26 + b26
            r27 = r27 + b27 r28 = r28 + b28 r29 = r29 + b29 r30 = r30 + b30 r31 = r31 + b31 r32 = r32 + b32
          end
        end
        if not term.lone then
          packed =
            spack(FB, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, r16, r17, r18, r19, r20,
              r21, r22, r23, r24, r25, r26, r27, r28, r29, r30, r31, r32)
        end
        term.out[blk] = packed
        if single then
          c1 = r1 c2 = r2 c3 = r3 c4 = r4 c5 = r5 c6 = r6 c7 = r7 c8 = r8 c9 = r9 c10 = r10 c11 = r11 c12 = r12
          c13 = r13 c14 = r14 c15 = r15 c16 = r16 c17 = r17 c18 = r18 c19 = r19 c20 = r20 c21 = r21 c22 = r22
          c23 = r23 c24 = r24 c25 = r25 c26 = r26 c27 = r27 c28 = r28 c29 = r29 c30 = r30 c31 = r31 c32 = r32
          aggs[blk] = packed
        else
          c1 = c1 + r1 c2 = c2 + r2 c3 = c3 + r3 c4 = c4 + r4 c5 = c5 + r5 c6 = c6 + r6 c7 = c7 + r7 c8 = c8 + r8
          c9 = c9 + r9 c10 = c10 + r10 c11 = c11 + r11 c12 = c12 + r12 c13 = c13 + r13 c14 = c14 + r14
          c15 = c15 + r15 c16 = c16 + r16 c17 = c17 + r17 c18 = c18 + r18 c19 = c19 + r19 c20 = c20 + r20
          c21 = c21 + r21 c22 = c22 + r22 c23 = c23 + r23 c24 = c24 + r24 c25 = c25 + r25 c26 = c26 + r26
          c27 = c27 + r27 c28 = c28 + r28 c29 = c29 + r29 c30 = c30 + r30 c31 = c31 + r31 c32 = c32 + r32
        end
      else
        local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12, b13, b14, b15, b16, b17, b18, b19, b20, b21, b22,
          b23, b24, b25, b26, b27, b28, b29, b30, b31, b32 =
          sunpack(FB, term.stored, pos)
        c1 = c1 + b1 c2 = c2 + b2 c3 = c3 + b3 c4 = c4 + b4 c5 = c5 + b5 c6 = c6 + b6 c7 = c7 + b7 c8 = c8 + b8
        c9 = c9 + b9 c10 = c10 + b10 c11 = c11 + b11 c12 = c12 + b12 c13 = c13 + b13 c14 = c14 + b14
        c15 = c15 + b15 c16 = c16 + b16 c17 = c17 + b17 c18 = c18 + b18 c19 = c19 + b19 c20 = c20 + b20
        c21 = c21 + b21 c22 = c22 + b22 c23 = c23 + b23 c24 = c24 + b24 c25 = c25 + b25 c26 = c26 + b26
        c27 = c27 + b27 c28 = c28 + b28 c29 = c29 + b29 c30 = c30 + b30 c31 = c31 + b31 c32 = c32 + b32
      end
    end
    if not single then
      aggs[blk] =
        spack(FB, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21,
          c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32)
    end
    -- the cheap look: finite squares mean finite values and, with counts of 0 or >= 1, finite moments
    local sq =
      c1 * c1 + c2 * c2 + c3 * c3 + c4 * c4 + c5 * c5 + c6 * c6 + c7 * c7 + c8 * c8 + c9 * c9 + c10 * c10
        + c11 * c11 + c12 * c12 + c13 * c13 + c14 * c14 + c15 * c15 + c16 * c16 + c17 * c17 + c18 * c18 + c19 * c19
        + c20 * c20 + c21 * c21 + c22 * c22 + c23 * c23 + c24 * c24 + c25 * c25 + c26 * c26 + c27 * c27 + c28 * c28
        + c29 * c29 + c30 * c30 + c31 * c31 + c32 * c32
    local slow = sq - sq ~= 0
    if not slow then
      if base < cs then -- count values: never negative; a fraction makes the moments' cheap look unsound
        if base + BLOCK > cs then -- counts, then sums: the counts alone element by element
          if cs == 1 then -- one count, the first value (its problem: the checks element by element name it)
            slow = p1 - p1 ~= 0 or p1 < 0 or c1 - c1 ~= 0
            if not slow then
              counts[1] = c1
              if c1 > 0 and c1 < 1 then st.ok = false end
            end
          else
            local why, of_agg = check(st, base, cs - base, {p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13,
              p14, p15, p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32}, {c1,
              c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23,
              c24, c25, c26, c27, c28, c29, c30, c31, c32})
            if why then return nil, why, of_agg end
          end
          slow = slow or not st.ok or base + BLOCK > cs + size and mmin(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10,
            p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31,
            p32) < 0
        elseif mmin(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21,
          p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32) < 0 then
          slow = true
        elseif mmin(c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21,
          c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32) < 1 then
          for _, n in ipairs({c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19,
            c20, c21, c22, c23, c24, c25, c26, c27, c28, c29, c30, c31, c32}) do
            if n > 0 and n < 1 then st.ok = false end
          end
        end
      elseif not st.ok then
        slow = true -- counts that are fractions
      elseif base + BLOCK > cs + size and mmin(p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15,
        p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32) < 0 then
        slow = true -- sumsq values that may be negative
      end
    end
    if slow then
      local why, of_agg = check(st, base, BLOCK, {p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15,
        p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31, p32}, {c1, c2, c3, c4, c5,
        c6, c7, c8, c9, c10, c11, c12, c13, c14, c15, c16, c17, c18, c19, c20, c21, c22, c23, c24, c25, c26, c27,
        c28, c29, c30, c31, c32})
      if why then return nil, why, of_agg end
    end
    base, pos = base + BLOCK, pos + BLOCK * 8
  end
  local made = {}
  for ti = 1, nterms do
    local term = tree[ti]
    local parts = term.parts
    if parts then
      for pi = 1, #parts do if parts[pi].members then parts[pi].sum = once(made, parts[pi].out, join) end end
      term.sum = once(made, term.out, join) -- (a sum's string made once, however many share its blocks)
    end
  end
  return once(made, aggs, join)
end
-- END GENERATED fold_values

-- Each semantics checks a reported key before anything is written (check: nil, or the rejection;
-- it leaves on the item what its apply writes) and writes it once every key has passed (apply).
-- (item: the key's name, payload, semantics, meta and data hashes and its next version.)

-- broadcast: the owner's value replaces the key's.
local function check_broadcast(item, spec, decl)
  local name, payload, kd, width = item.name, item.payload, item.data, decl.width
  local owner = decl.owner
  if owner ~= '' and owner ~= shard then
    return reject('not_owner', name, 'shard ' .. shard .. ' may not write a key owned by shard ' .. tostring(owner))
  end
  local kt = redis.call('TYPE', kd)['ok']
  if kt ~= 'none' and kt ~= 'hash' then return reject('corrupt_state', name, not_hash(kd)) end
  local why = check_payload(name, payload, width, 0, width)
  if why then return reject(why[1], why[2], why[3]) end
end

local function apply_broadcast(item)
  redis.call('HSET', item.data, 'value', item.payload)
  redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', now_s, 'writer', shard,
    'writer_incarnation', inc)
end

-- merge: the fleet aggregate is the retired history plus every live slot, summed in a fixed order.
-- Its check runs in four steps over one table of the key's working state (k): the writers and live
-- slots, the reads of the stored sums, the proof that the sums about to be re-made were right, and
-- the sums themselves (the fused pass).

-- The merge key's working state, one table for every fold of the VM (its four steps run one key at a
-- time, and merge_live sets every field the others read before they run: a table made per fold
-- costs its size each time, and a collection step later)
local WORK = {count_size = false, size = false, width = false, name = false, payload = false, me = false,
  sumsq = false, idname = false, was_writer = false, prior = false, rebuild = false, myq = false,
  live = false, tsub = false, subs = false, ends = false, groups = false, gorder = false, tgroup = false,
  qstored = false, own_counts = false, slots = false, got = false, gread = false, redo = false, resum = false,
  retired = false, lifecycle = false}
-- A key's writers (its key-meta field 'writers': shard ids, ascending, comma-separated, each without
-- a leading zero), parsed once per Lua VM and remembered by their own text: the ids as numbers, the
-- decimal name of each in NAMES. nil and the first id that is not one (a text changes only when
-- the writers do: a pattern match, a number made and a table grown per writer otherwise).
local WRITERS, nwriters, NAMES = {}, 0, {}
local function writers_of(text)
  local ids = WRITERS[text]
  if ids then return ids end
  ids = {}
  local last = -1
  for w in string.gmatch(text, '[^,]+') do
    local id = not string.find(w, '^0%d') and not string.find(w, '%D') and tonumber(w)
    if not id or id <= last or #w > 9 then return nil, w end
    last = id
    ids[#ids + 1] = id
    NAMES[id] = w
  end
  if nwriters >= 256 then -- (a bound on what the VM keeps; NAMES then holds only the ids of texts kept)
    WRITERS, nwriters = {}, 0
    for id in pairs(NAMES) do NAMES[id] = nil end
    for k = 1, #ids do NAMES[ids[k]] = string.format('%d', ids[k]) end
  end
  WRITERS[text], nwriters = ids, nwriters + 1
  return ids
end

-- the writers and the live slots after this fold, by sub-group and group
local function merge_live(item, spec, decl) -- nil and the key's working state, or the rejection
  local name, payload, km = item.name, item.payload, item.meta
  local width, count_size, size = decl.width, decl.count_size, decl.size
  local sumsq = width == count_size + 2 * size -- (count || sum || sumsq, or count || sum)
  if count_size < 1 or (width ~= count_size + size and not sumsq) then
    return reject('corrupt_state', name, 'the key\'s declaration is not a merge key\'s (width ' .. width ..
      ', count_size ' .. count_size .. ', size ' .. size .. ')')
  end
  item.width, item.count_size, item.size = width, count_size, size
  local stale, me = decl.stale, shard + 0
  -- a slot not refreshed for stale_after_s leaves a state key; a history key keeps it (its samples
  -- stay counted, as a fresh restart would retire them: the same whichever shard's fold notices it)
  if decl.lifecycle ~= 'state' then stale = nil end
  -- (Lua makes a string of a number with a printf, and a C function costs a call: names of ids,
  -- sub-groups and groups are made once each, and loops over lists count)
  -- the other live writers, in ascending order (the fold stores them so), and (stale keys) when
  -- each last wrote; prior: the ids that wrote before this fold, ascending (this shard among them)
  local prior, bad = writers_of(spec[4] or '')
  if not prior then
    return refuse(item, 'corrupt_state', 'writers holds ' .. string.format('%q', bad) .. ' (shard ids, ascending)')
  end
  NAMES[me] = shard
  local idname = NAMES -- (every id's decimal name)
  local ids, nids, was_writer = {}, 0, false
  for k = 1, #prior do
    local id = prior[k]
    if id ~= me then nids = nids + 1; ids[nids] = id else was_writer = true end
  end
  local at = NONE -- (tables made only where something is read into them)
  if stale and nids > 0 then
    local atf = {}
    for k = 1, nids do atf[k] = 'slot:' .. idname[ids[k]] .. ':at_us' end
    at = hmget(km, atf) or {}
  end
  -- (state keys) when each other writer's lease on its shard id runs out, in the run's served clock
  -- (clock.lua: a stall of the server runs out nobody's lease): a shard whose lease has lapsed for
  -- longer than lease_grace_s, or was given up (-1: a clean stop), has left the fleet. A fold of the
  -- shard after its lease ran out moved the lease's end to that fold (it lived on), so whichever fold
  -- comes first, the slot's fate is the same. A shard that never leased is not judged.
  local grace, lapsed = decl.grace, NONE
  if grace and nids > 0 then
    local served = run_clock()
    lapsed = {}
    local lf = {}
    for k = 1, nids do lf[k] = idname[ids[k]] .. ':alive_until_us' end
    local leased = hmget(KEYS[2], lf) or {}
    local span = grace * 1e6
    for k = 1, nids do
      local u = leased[k] and tonumber(leased[k])
      if u and (u < 0 or served - u > span) then lapsed[k] = true end
    end
  end
  -- the live slots after this fold (a slot not refreshed for stale_after_s, or whose shard's lease
  -- lapsed, stops weighting the fleet); the sub-groups whose members change are re-made, and so
  -- are their groups
  local rebuild = spec[6] ~= LAYOUT
  item.rebuild = rebuild
  item.forget = {}
  -- (sub-groups and groups by integer arithmetic: math.floor is a C call)
  local myq = (me - me % SUB) / SUB
  local live, nlive, tsub = {}, 0, {[myq] = true}
  local mine_added = false
  for k = 1, nids do
    local id = ids[k]
    if not mine_added and id > me then nlive = nlive + 1; live[nlive] = me; mine_added = true end
    local gone = stale and now - (tonumber(at[k]) or 0) > stale * 1e6
    if not gone and lapsed[k] then
      gone = true
      item.lapsed = (item.lapsed or 0) + 1
    end
    if gone then
      item.forget[#item.forget + 1] = id
      tsub[(id - id % SUB) / SUB] = true
    else
      nlive = nlive + 1
      live[nlive] = id
    end
  end
  if not mine_added then nlive = nlive + 1; live[nlive] = me end
  -- (the writers as stored when they did not change: this shard among them, none dropped)
  item.was, item.incarnation, item.writers = spec[4], spec[5], spec[4]
  if not was_writer or #item.forget > 0 then
    local names = {}
    for k = 1, nlive do names[k] = idname[live[k]] end
    item.writers = table.concat(names, ',')
  end
  -- live[subs[q] .. ends[q]]: the live ids of sub-group q; groups[g]: its live sub-groups; gorder:
  -- the live groups (live is ascending: a sub-group's members and a group's sub-groups come one after
  -- another, so a sub-group is a stretch of live, not a table of its own)
  local subs, ends, groups, gorder = {}, {}, {}, {}
  local q0, gs, ng = -1, nil, 0
  for k = 1, nlive do
    local id = live[k]
    local q = (id - id % SUB) / SUB
    if q ~= q0 then
      q0 = q
      subs[q] = k
      local g = (q - q % SUBS) / SUBS
      if ng == 0 or gorder[ng] ~= g then gs = {}; groups[g] = gs; ng = ng + 1; gorder[ng] = g end
      gs[#gs + 1] = q
      if rebuild then tsub[q] = true end
    end
    ends[q] = k
  end
  local tgroup = {}
  for q in pairs(tsub) do tgroup[(q - q % SUBS) / SUBS] = true end

  local k = WORK
  k.lifecycle = decl.lifecycle
  k.count_size, k.size, k.width, k.name, k.payload, k.me, k.sumsq, k.idname, k.was_writer, k.prior,
    k.rebuild, k.myq, k.live, k.tsub, k.subs, k.ends, k.groups, k.gorder, k.tgroup =
    count_size, size, width, name, payload, me, sumsq, idname, was_writer, prior,
    rebuild, myq, live, tsub, subs, ends, groups, gorder, tgroup
  return nil, k
end

-- what the fold reads of the data hash, and the history this fold retires
local function merge_read(item, spec, resumed, k)
  local count_size, size, width, name, payload, me, sumsq, idname, rebuild, live, tsub, subs, ends,
    groups, gorder, tgroup =
    k.count_size, k.size, k.width, k.name, k.payload, k.me, k.sumsq, k.idname, k.rebuild, k.live,
      k.tsub, k.subs, k.ends, k.groups, k.gorder, k.tgroup
  -- What the fold reads of the data hash, in as few HMGETs as the stored sums allow (one, unless a
  -- sum is missing): the history; this shard's count record (and its previous slot, when a new
  -- incarnation retires it); every live group's sum, or of a touched group (re-made) its count
  -- record; of a group re-made, its sub-groups' sums, or of a touched one (re-made) its count
  -- record; the slots of every sub-group re-made, and the stale ones dropped. A group or sub-group
  -- whose sum is missing (a run restored from a snapshot without it) is re-made from its parts.
  local whole, part = width * 8, count_size * 8
  local plan = {n = 0, fields = {}, sizes = {}, owners = {}, got = {}, slots = {[me] = payload}}
  local got, slots = plan.got, plan.slots
  local retiring = spec[5] and spec[5] ~= inc and not resumed and k.lifecycle ~= 'state'
  local own_field = own.slot
  ask(plan, 'retired', whole)
  ask(plan, own.counts, part)
  if retiring then ask(plan, own_field, whole) end
  local gread = {}
  for k = 1, #gorder do
    local g = gorder[k]
    if tgroup[g] then
      gread[k] = 'counts:group:' .. decimal(g)
      if not rebuild then ask(plan, gread[k], part) end
      local qs = groups[g]
      for j = 1, #qs do
        local q = qs[j]
        if not rebuild then
          local qs_name = decimal(q)
          if tsub[q] then ask(plan, 'counts:sub:' .. qs_name, part) else ask(plan, 'sub:' .. qs_name, whole) end
        end
        if tsub[q] then ask_slots(plan, live, subs[q], ends[q], me, idname, whole) end
      end
    else
      gread[k] = 'group:' .. decimal(g)
      if not rebuild then ask(plan, gread[k], whole) end
    end
  end
  for q in pairs(tsub) do
    if not subs[q] and not rebuild then ask(plan, 'counts:sub:' .. decimal(q), part) end
  end
  for k = 1, #item.forget do local id = item.forget[k] ask(plan, 'slot:' .. idname[id], whole, id) end
  local bad = fetch(plan, item, idname)
  if bad then return bad end
  local redo, resum = {}, {}
  for k = 1, #gorder do
    local g = gorder[k]
    redo[g] = tgroup[g] or not got[gread[k]]
    if redo[g] and not tgroup[g] then
      local qs = groups[g]
      for j = 1, #qs do ask(plan, 'sub:' .. decimal(qs[j]), whole) end
    end
  end
  if plan.n > 0 then bad = fetch(plan, item, idname); if bad then return bad end end
  local qstored = {} -- per sub-group: its stored sum, or (touched) its count record
  for k = 1, #gorder do
    local g = gorder[k]
    if redo[g] then
      local qs = groups[g]
      for j = 1, #qs do
        local q = qs[j]
        qstored[q] = got[(tsub[q] and 'counts:sub:' or 'sub:') .. decimal(q)]
        resum[q] = tsub[q] or not qstored[q]
        if resum[q] and not tsub[q] then ask_slots(plan, live, subs[q], ends[q], me, idname, whole) end
      end
    end
  end
  for q in pairs(tsub) do if not subs[q] then qstored[q] = got['counts:sub:' .. decimal(q)] end end
  if plan.n > 0 then bad = fetch(plan, item, idname); if bad then return bad end end
  local retired, own_counts = got['retired'], got[own.counts]
  local old = retiring and got[own_field]
  if old then
    -- a new incarnation that did not resume: the previous life is history (retired) or a state (dropped)
    if retired then
      local sum, e = sum_checked(name, {retired, old}, width, count_size, size, sumsq)
      if not sum then return refuse(item, e[1], e[3]) end
      retired = sum
    else
      retired = old
    end
    item.retired = retired
  end
  k.qstored, k.own_counts, k.slots, k.got, k.gread, k.redo, k.resum, k.retired =
    qstored, own_counts, slots, got, gread, redo, resum, retired
end

-- the stored sums this fold re-makes were the sums of their parts before it
local function merge_prove(item, k)
  local count_size, me, was_writer, prior, rebuild, myq, tsub, gorder, tgroup, qstored, own_counts, slots, got,
    gread =
    k.count_size, k.me, k.was_writer, k.prior, k.rebuild, k.myq, k.tsub, k.gorder, k.tgroup, k.qstored,
      k.own_counts, k.slots, k.got, k.gread
  -- A stored sum about to be re-made must have been the sum of its parts before this fold: checked
  -- on the count records (count_size values per part; the same operations, so the same bits).
  if not rebuild then
    for q in pairs(tsub) do
      local sum = qstored[q]
      -- (without this shard's own count record, its part is unknown: nothing to prove)
      if sum and (own_counts or not was_writer or myq ~= q) then
        local parts = {}
        for k = 1, #prior do -- (ascending: past the sub-group's ids, nothing more of it)
          local id = prior[k]
          if id >= (q + 1) * SUB then break end
          if id >= q * SUB then parts[#parts + 1] = id == me and own_counts or slots[id] end
        end
        if count_sum(parts, count_size) ~= sum then
          return refuse(item, 'corrupt_state', 'stored sub:' .. q .. ' disagrees with the sum of its slots')
        end
      end
    end
    for k = 1, #gorder do
      local g, sum = gorder[k], got[gread[k]]
      if tgroup[g] and sum then
        local parts, whole, prev = {}, true, nil
        for j = 1, #prior do
          local id = prior[j]
          if id >= (g + 1) * SUB * SUBS then break end
          local q = (id - id % SUB) / SUB
          if (q - q % SUBS) / SUBS == g and q ~= prev then
            parts[#parts + 1] = qstored[q]
            whole, prev = whole and qstored[q] and true, q -- (HMGET gives false for a missing field)
          end
        end
        if whole and count_sum(parts, count_size) ~= sum then
          return refuse(item, 'corrupt_state', 'stored group:' .. g .. ' disagrees with the sum of its sub-groups')
        end
      end
    end
  end
end

-- the aggregate's sums, re-made in one fused pass, and what the apply writes
local function merge_sums(item, k)
  local count_size, size, width, name, payload, me, sumsq, idname, rebuild, live, tsub, subs, ends,
    groups, gorder, tgroup, qstored, slots, got, gread, redo, resum, retired =
    k.count_size, k.size, k.width, k.name, k.payload, k.me, k.sumsq, k.idname, k.rebuild, k.live,
      k.tsub, k.subs, k.ends, k.groups, k.gorder, k.tgroup, k.qstored, k.slots, k.got, k.gread, k.redo, k.resum,
      k.retired
  -- the aggregate's terms in order: the retired history, then the groups in ascending order, each
  -- re-made (from its sub-groups in ascending order, each stored or re-made from its slots in
  -- ascending order) or stored (semantics.py sums in the same order)
  local tree, made = {}, {}
  item.emptied = {}
  if retired then tree[1] = {stored = retired} end
  for k = 1, #gorder do
    local g = gorder[k]
    if redo[g] then
      local parts, qs = {}, groups[g]
      for j = 1, #qs do
        local q = qs[j]
        if resum[q] then
          local vs, field = {}, 'sub:' .. decimal(q)
          for x = subs[q], ends[q] do local id = live[x] vs[#vs + 1] = id == me or slots[id] end
          parts[j] = {members = vs, out = {}}
          made[#made + 1] = {field, parts[j], #qs == 1, rebuild or got['counts:' .. field] or got[field]}
        else
          parts[j] = {stored = qstored[q]}
          if #qs == 1 then -- the sub-group left alone in its group (the others emptied): its sum is the group's
            item.emptied[#item.emptied + 1] = 'sub:' .. decimal(q)
            item.emptied[#item.emptied + 1] = 'counts:sub:' .. decimal(q)
          end
        end
      end
      tree[#tree + 1] = {parts = parts, out = {}}
      local field = 'group:' .. decimal(g)
      made[#made + 1] = {field, tree[#tree], false, rebuild or got['counts:' .. field] or got[field]}
    else
      tree[#tree + 1] = {stored = got[gread[k]]}
    end
  end
  local agg, why, of_agg = fold_values(name, payload, width, count_size, size, sumsq, tree)
  if not agg then
    if of_agg then return refuse(item, why[1], why[3]) end
    return reject(why[1], why[2], why[3])
  end
  local cut = 8 * count_size
  item.sums = {own.counts, string.sub(payload, 1, cut)}
  -- (made: {field, its node, whether it is lone, whether it may be stored}; a group is lone when
  -- the aggregate has it alone, which is known once the tree is complete)
  local sums, emptied = item.sums, item.emptied
  for k = 1, #made do
    local field, node, lone, stored = made[k][1], made[k][2], made[k][3], made[k][4]
    if node.parts then lone = #tree == 1 end
    if not lone then
      local n = #sums
      sums[n + 1], sums[n + 2], sums[n + 3], sums[n + 4] =
        field, node.sum, 'counts:' .. field, string.sub(node.sum, 1, cut)
    elseif stored then -- stored when it was not lone: gone, or it would go out of date
      emptied[#emptied + 1] = field
      emptied[#emptied + 1] = 'counts:' .. field
    end
  end
  if rebuild then -- every live slot's count record
    for k = 1, #live do
      local id = live[k]
      if id ~= me then
        item.sums[#item.sums + 1] = 'counts:slot:' .. idname[id]
        item.sums[#item.sums + 1] = string.sub(slots[id], 1, cut)
      end
    end
  end
  for q in pairs(tsub) do
    if not subs[q] then
      item.emptied[#item.emptied + 1] = 'sub:' .. decimal(q)
      item.emptied[#item.emptied + 1] = 'counts:sub:' .. decimal(q)
    end
  end
  for g in pairs(tgroup) do
    if not groups[g] then
      item.emptied[#item.emptied + 1] = 'group:' .. decimal(g)
      item.emptied[#item.emptied + 1] = 'counts:group:' .. decimal(g)
    end
  end
  item.agg = agg
end

local function check_merge(item, spec, decl, resumed)
  local bad, k = merge_live(item, spec, decl)
  if bad then return bad end
  return merge_read(item, spec, resumed, k) or merge_prove(item, k) or merge_sums(item, k)
end

local function apply_merge(item)
  for _, id in ipairs(item.forget) do
    redis.call('HDEL', item.meta, 'slot:' .. id .. ':incarnation', 'slot:' .. id .. ':seq',
      'slot:' .. id .. ':at_us')
    redis.call('HDEL', item.data, 'slot:' .. id, 'counts:slot:' .. id)
  end
  local lapsed = item.lapsed or 0
  if #item.forget > lapsed then redis.call('HINCRBY', item.meta, 'dropped_stale', #item.forget - lapsed) end
  if lapsed > 0 then redis.call('HINCRBY', item.meta, 'dropped_lapsed', lapsed) end
  if item.retired then redis.call('HSET', item.data, 'retired', item.retired) end
  if #item.emptied > 0 then redis.call('HDEL', item.data, unpack(item.emptied)) end
  redis.call('HSET', item.data, 'agg', item.agg, own.slot, item.payload, unpack(item.sums))
  if item.rebuild then redis.call('HSET', item.meta, 'sums_layout', LAYOUT) end
  if item.writers ~= item.was then redis.call('HSET', item.meta, 'writers', item.writers) end
  if item.incarnation ~= inc then redis.call('HSET', item.meta, own.slot_incarnation, inc) end
  redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', now_s,
    own.slot_seq, seq, own.slot_at, now_s)
end

-- maximum: the element-wise maximum of the stored value and the payload (a value that is not greater
-- keeps the stored one, bit for bit); the key's version moves only when the value grows.
local function check_maximum(item, spec, decl)
  local name, payload, width = item.name, item.payload, decl.width
  local why = check_payload(name, payload, width, 0, width)
  if why then return reject(why[1], why[2], why[3]) end
  local stored = redis.pcall('HGET', item.data, 'value')
  if type(stored) == 'table' then return reject('corrupt_state', name, not_hash(item.data)) end
  if not stored then item.value = payload return nil end
  if #stored ~= width * 8 then
    return reject('corrupt_state', name, 'stored value is ' .. #stored .. ' bytes, the key needs ' .. (width * 8))
  end
  local out, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    local p, s = {sunpack(fmt, payload, pos)}, {sunpack(fmt, stored, pos)}
    for k = 1, len do
      local v = s[k]
      if v - v ~= 0 then return reject('corrupt_state', name, 'stored element ' .. (base + k - 1) .. ' is not finite') end
      if p[k] > v then s[k] = p[k] end
    end
    out[#out + 1] = spack(fmt, unpack(s, 1, len))
    base = base + len
    pos = pos + len * 8
  end
  item.value = join(out)
  if item.value == stored then item.version, item.unchanged = item.version - 1, true end
end

local function apply_maximum(item)
  if item.unchanged then return end
  redis.call('HSET', item.data, 'value', item.value)
  redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', now_s)
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
    key = p .. 'key:', data = p .. 'data:'}
  if nruns >= 256 then RUNS, nruns = {}, 0 end -- (a bound on what the VM keeps)
  RUNS[meta_key], nruns = names, nruns + 1
  return names
end

-- Whether km and kd are the run's key-meta and data hashes of the key name: nil, or {kd, name, the
-- key's field in a report's stream entry}; a pair found right is remembered (by its meta hash) for
-- the VM's later folds.
local PAIRS, npairs = {}, 0
local function key_pair(km, kd, name)
  local known = PAIRS[km]
  if known and known[1] == kd and known[2] == name then return known end
  if km ~= run.key .. name or kd ~= run.data .. name then return nil end
  if npairs >= 4096 then PAIRS, npairs = {}, 0 end
  known = {kd, name, 'report:' .. name}
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

-- The reported keys' items (what each key's check leaves for its apply), one table per position in
-- the report for every fold of the VM: the fold sets every field of the ones it uses before a check
-- reads them (a table made per key per fold costs its size, and a collection step later), and lets
-- go of the vectors once it has written them.
local ITEMS = {}
local function let_go(n)
  for i = 1, n do
    local item = ITEMS[i]
    item.payload, item.retired, item.sums, item.agg, item.value = false, false, false, false, false
  end
  WORK.payload, WORK.slots, WORK.got, WORK.qstored, WORK.retired = false, false, false, false, false
end

-- each semantics' check and apply, by name (fold() dispatches every key through them)
local CHECKS = {broadcast = check_broadcast, merge = check_merge, maximum = check_maximum}
local APPLIES = {broadcast = apply_broadcast, merge = apply_merge, maximum = apply_maximum}

local function fold(keys, args)
  KEYS, ARGV = keys, args
  if not sunpack then local struct = struct_library(); sunpack, spack = struct.unpack, struct.pack end
  run = run_keys(KEYS[1])
  if not run then return {'rejected', 'malformed', '', 'KEYS[1] is not a redisync meta key'} end

  meta = redis.call('HMGET', KEYS[1], 'epoch', 'digest', 'limits', 'fleet_version', 'server')
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
    local spec = redis.pcall('HMGET', km, 'semantics', 'declared', 'version', 'writers',
      own.slot_incarnation, 'sums_layout')
    if spec['err'] then return reject('corrupt_state', name, not_hash(km)) end
    if not spec[1] then return reject('unknown_key', name, 'not declared in the run\'s schema') end
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
    item.name, item.payload, item.semantics, item.meta, item.data, item.version = name, payload, spec[1], km, kd,
      version + 1
    item.field, item.bytes = pair[3], decl.bytes -- (its stream entry's field, and what it says of the payload)
    item.width, item.count_size, item.size, item.rebuild, item.forget, item.lapsed, item.was, item.incarnation,
      item.writers, item.retired, item.emptied, item.sums, item.agg, item.value, item.unchanged =
      false, false, false, false, false, false, false, false, false, false, false, false, false, false, false
    item.graced = decl.grace and true or false -- (a lease grace: the fold reads the run's clock)
    local check_key = CHECKS[spec[1]]
    if not check_key then
      return reject('corrupt_state', name, 'unknown semantics ' .. string.format('%q', spec[1]))
    end
    local bad = check_key(item, spec, decl, resumed)
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
    APPLIES[item.semantics](item)
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
    if alive and alive < served then redis.call('HSET', KEYS[2], own.alive, string.format('%.0f', served)) end
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

  redis.call('PUBLISH', run.versions, fv .. ' ' .. epoch) -- (the epoch: a run lost and registered
  -- again starts its versions over, so a version alone would not tell its followers)

  let_go(nkeys)
  local reply = {'applied', fleet_version, now_s, epoch}
  for i = 1, nkeys do reply[4 + i] = versions[i] end
  return reply
end

export('fold', fold)
