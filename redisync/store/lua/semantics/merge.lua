-- merge.lua: the fleet aggregate is the exact sum of every shard's live slot plus the retired history
-- (pooled statistics: count || sum [|| sum of squares]), re-made at every fold in a fixed order.
-- Data hash: 'agg', 'slot:<id>', 'retired', the stored sums ('sub:<q>', 'group:<g>', and their
-- 'counts:' twins). Key meta: 'writers', 'slot:<id>:incarnation|seq|at_us', 'sums_layout',
-- 'dropped_stale', 'dropped_lapsed'.
-- (the Python twin: redisync/store/semantics/merge.py, which sums in the same order; shared.lua
-- says what each function does)

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
-- added in the order merge.py adds them (a sub-group: 0 + its slots in ascending shard order; a
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

-- The check
-- The fleet aggregate is the retired history plus every live slot, summed in a fixed order.
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
  -- ascending order) or stored (merge.py sums in the same order)
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

-- the key-meta fields the check reads beside the envelope's: spec[4], spec[5], spec[6]
local function reads(own_fields)
  return 'writers', own_fields.slot_incarnation, 'sums_layout'
end

local function check(item, spec, decl, resumed)
  -- (every field the apply reads is set by this check, or false: the item is the VM's, see ITEMS)
  item.width, item.count_size, item.size, item.rebuild, item.forget, item.lapsed, item.was, item.incarnation,
    item.writers, item.retired, item.emptied, item.sums, item.agg =
    false, false, false, false, false, false, false, false, false, false, false, false, false
  local bad, k = merge_live(item, spec, decl)
  if bad then return bad end
  return merge_read(item, spec, resumed, k) or merge_prove(item, k) or merge_sums(item, k)
end

local function apply(item)
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
  -- (the VM keeps the item and the working state: let go of the vectors)
  item.retired, item.sums, item.agg = false, false, false
  WORK.payload, WORK.slots, WORK.got, WORK.qstored, WORK.retired = false, false, false, false, false
end

-- the aggregate, and the caller's own slot as folded with its incarnation (a reader without a
-- slot, caller '', gets neither)
local function pull(km, kd, caller)
  local value, own_slot, own_inc = redis.call('HGET', kd, 'agg')
  if caller ~= '' then
    own_slot = redis.call('HGET', kd, 'slot:' .. caller)
    own_inc = redis.call('HGET', km, 'slot:' .. caller .. ':incarnation')
  end
  return value, own_slot, own_inc
end

return {reads = reads, check = check, apply = apply, pull = pull}

