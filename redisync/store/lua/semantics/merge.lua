-- merge.lua: the fleet aggregate is the exact sum of every shard's live slot plus the retired history
-- (pooled statistics: count || sum [|| sum of squares]), correctly rounded: a function of the last
-- reports, not of the order in which they came.
-- Data hash: 'agg' (the exact sum rounded), 'agg_lo' (the rest of it: one plane or more), 'slot:<id>',
-- 'retired' and 'retired_lo' (the history, the same way). Key meta: 'slot:<id>:incarnation|seq|at_us',
-- 'sums_layout'; the life cycle's 'writers', 'dropped_stale', 'dropped_lapsed', 'retired_departed'
-- (lifecycle.lua: the envelope judges who has left, and this module drops or retires their slots).
-- (the Python twin: redisync/store/semantics/merge.py, whose exact_planes says what the planes are)

-- A fold adds what changed to the stored exact sum: its shard's new slot in, its previous slot out
-- (unless a history key retires it: it stays counted), a slot that leaves out. Each element of the
-- sum is kept as canonical planes c1 = fl(S), c2 = fl(S - c1), ...: c1 is the fleet value a pull
-- reads, and two planes hold almost every sum (a value's 53 bits and its rest); a sum that needs more
-- takes the general path (expansions of any length, Shewchuk's), whose cost grows with the planes,
-- never with the slots. A key whose sums were kept otherwise (sums_layout) has them re-made from its
-- slots once. Every value is at most LIMIT in magnitude, so no partial sum overflows.
-- BEGIN GENERATED constants
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local LIMIT = 2 ^ 1000
local LAYOUT = 'exact/1'
-- END GENERATED constants
local three_planes, exact_general = EXACT.three_planes, EXACT.general -- (exact.lua)

-- The first problem of a payload, in element order: a value not finite or beyond LIMIT, a negative
-- count or sum of squares. nil, or {reason, key name, detail}.
local function payload_problem(name, payload, width, cs, size)
  local pos, base = 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local p = {sunpack(fmt_of(len), payload, pos)}
    for j = 1, len do
      local g, v = base + j, p[j]
      if v - v ~= 0 then return {'non_finite', name, 'element ' .. (g - 1) .. ' is not finite'} end
      if v > LIMIT or v < -LIMIT then
        return {'non_finite', name, 'element ' .. (g - 1) .. ' is ' .. g17(v) .. ', beyond 2^1000 in magnitude ' ..
          '(the bound that keeps the fleet\'s exact sum finite)'}
      end
      if v < 0 and (g <= cs or g > cs + size) then
        return {'negative', name, 'element ' .. (g - 1) .. ' is ' .. g17(v) ..
          ' in a count or sumsq part (must be >= 0)'}
      end
    end
    base, pos = base + len, pos + len * 8
  end
  return nil
end

-- A refusal of a merge key: the payload's own problem, if it has one, first.
local function refuse(key, reason, detail)
  local why = payload_problem(key.name, key.payload, key.width, key.count_size, key.size)
  if why then return reject(why[1], why[2], why[3]) end
  return reject(reason, key.name, detail)
end

-- The first element (in order) whose fleet moments a reader could not take: mean = sum / count,
-- its square (with sums of squares), sumsq / count. nil, or the detail.
local function moments_problem(agg, width, cs, size, sumsq)
  local counts, pos, base = {}, 1, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local c = {sunpack(fmt_of(len), agg, pos)}
    for j = 1, len do
      local g, a = base + j, c[j]
      if g <= cs then
        counts[g] = a
      else
        local e = (g - cs - 1) % size
        local n = counts[cs == 1 and 1 or e + 1]
        if n > 0 then
          local m = a / n
          if m - m ~= 0 or (g <= cs + size and sumsq and (m * m) - (m * m) ~= 0) then
            return 'the fleet moments would overflow at element ' .. e
          end
        end
      end
    end
    base, pos = base + len, pos + len * 8
  end
  return nil
end

-- What a fold reads of a data hash: plan.n fields, with the length each must have and the writer
-- whose slot it is; fetch reads them into plan.got (and the slots into plan.slots), checked.
local function ask(plan, field, len, id)
  local n = plan.n + 1
  plan.n = n
  plan.fields[n], plan.sizes[n], plan.owners[n] = field, len, id or false
end

local function fetch(plan, key, idname) -- nil, or the rejection
  local fields, sizes, owners, got, slots = plan.fields, plan.sizes, plan.owners, plan.got, plan.slots
  local values = hmget(key.data, fields, plan.n)
  if not values then return refuse(key, 'corrupt_state', not_hash(key.data)) end
  for k = 1, plan.n do
    local v, field = values[k], fields[k]
    got[field] = v
    if v and sizes[k] and #v ~= sizes[k] then
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

-- The usual fold: a stored sum of two planes (hi, lo) minus the slot it replaces (sub, or nil) plus
-- the payload, each step three exact two-sums per element; the payload's checks on the way and, for
-- the moments, a cheap look (sums below 2^511 and counts 0 or >= 1: moments cannot overflow).
-- (agg, agg_lo) strings; or nil, 'general' when a sum needs a third plane; or nil, the rejection.
local BLOCK, FB, mmin = CHUNK, FMT, math.min
local SAFE = 2 ^ 511

-- The head: the first len values (fewer than a block: a merge key's count, usually), in tables.
-- Returns the head's planes and its cheap look, or nil, the problem.
local function exact_head(st, payload, hi, lo, sub, len)
  local cs, size = st.cs, st.size
  local fmt = fmt_of(len)
  local p, h, l = {sunpack(fmt, payload, 1)}, {sunpack(fmt, hi, 1)}, {sunpack(fmt, lo, 1)}
  local o = sub and {sunpack(fmt, sub, 1)}
  local look = true
  for j = 1, len do
    local v, x, y = p[j], h[j], l[j]
    if v - v ~= 0 or v > LIMIT or v < -LIMIT or (v < 0 and (j <= cs or j > cs + size)) then
      return nil, payload_problem(st.name, payload, st.width, cs, size)
    end
    if x + y ~= x then return nil, {'corrupt_state', st.name, 'stored agg and agg_lo are not an exact sum\'s planes'} end
    for pass = o and 1 or 2, 2 do
      local w = pass == 1 and -o[j] or v
      local s = x + w
      local bv = s - x
      local e = (x - (s - bv)) + (w - bv)
      local t = y + e
      bv = t - y
      local f = (y - (t - bv)) + (e - bv)
      if f ~= 0 then x, y = three_planes(s, t, f) if not x then return nil, 'general' end
      else x = s + t bv = x - s y = (s - (x - bv)) + (t - bv) end
    end
    h[j], l[j] = x, y
    if j <= cs then
      if x > 0 and x < 1 then look = false end
    elseif x >= SAFE or x <= -SAFE then
      look = false
    end
  end
  return spack(fmt, unpack(h, 1, len)), spack(fmt, unpack(l, 1, len)), look
end

-- the whole blocks after the head, BLOCK values at a time held in local variables: the look, or nil
-- and the problem ('general': a sum needs a third plane)
-- BEGIN GENERATED exact_blocks
-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)
local function exact_blocks(st, payload, hi, lo, sub, pos, base, blk, his, los)
  local width, cs, size, name = st.width, st.cs, st.size, st.name
  local s, bv, e, t, f, d, dd
  local look, scanned, sumsq = true, false, st.sumsq
  while base < width do
    blk = blk + 1
    local p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21, p22, p23,
      p24, p25, p26, p27, p28, p29, p30, p31, p32 =
      sunpack(FB, payload, pos)
    local sq =
      p1 * p1 + p2 * p2 + p3 * p3 + p4 * p4 + p5 * p5 + p6 * p6 + p7 * p7 + p8 * p8 + p9 * p9 + p10 * p10
        + p11 * p11 + p12 * p12 + p13 * p13 + p14 * p14 + p15 * p15 + p16 * p16 + p17 * p17 + p18 * p18 + p19 * p19
        + p20 * p20 + p21 * p21 + p22 * p22 + p23 * p23 + p24 * p24 + p25 * p25 + p26 * p26 + p27 * p27 + p28 * p28
        + p29 * p29 + p30 * p30 + p31 * p31 + p32 * p32
    -- a value past 2^511 in magnitude, a block of counts, a negative value in a sumsq block: the payload
    -- checked element by element, in order (once)
    if not scanned and (sq - sq ~= 0 or base < cs or base + BLOCK > cs + size and mmin(p1, p2, p3, p4, p5, p6, p7,
      p8, p9, p10, p11, p12, p13, p14, p15, p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29,
      p30, p31, p32) < 0) then
      local why = payload_problem(name, payload, width, cs, size)
      if why then return nil, why end
      scanned = true
    end
    local h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15, h16, h17, h18, h19, h20, h21, h22, h23,
      h24, h25, h26, h27, h28, h29, h30, h31, h32 =
      sunpack(FB, hi, pos)
    local l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19, l20, l21, l22, l23,
      l24, l25, l26, l27, l28, l29, l30, l31, l32 =
      sunpack(FB, lo, pos)
    -- each element's planes canonical: the first is the rounded sum of both
    if h1 + l1 ~= h1 or h2 + l2 ~= h2 or h3 + l3 ~= h3 or h4 + l4 ~= h4 or h5 + l5 ~= h5 or h6 + l6 ~= h6 or h7
      + l7 ~= h7 or h8 + l8 ~= h8 or h9 + l9 ~= h9 or h10 + l10 ~= h10 or h11 + l11 ~= h11 or h12
      + l12 ~= h12 or h13 + l13 ~= h13 or h14 + l14 ~= h14 or h15 + l15 ~= h15 or h16 + l16 ~= h16 or h17
      + l17 ~= h17 or h18 + l18 ~= h18 or h19 + l19 ~= h19 or h20 + l20 ~= h20 or h21 + l21 ~= h21 or h22
      + l22 ~= h22 or h23 + l23 ~= h23 or h24 + l24 ~= h24 or h25 + l25 ~= h25 or h26 + l26 ~= h26 or h27
      + l27 ~= h27 or h28 + l28 ~= h28 or h29 + l29 ~= h29 or h30 + l30 ~= h30 or h31 + l31 ~= h31 or h32
      + l32 ~= h32 then
      return nil, {'corrupt_state', name, 'stored agg and agg_lo are not an exact sum\'s planes'}
    end
    if sub then
      -- the payload in and the slot it replaces out: their difference, when it is one float (a
      -- cumulative statistic moves by less than half: always), else the slot out, then the payload in
      local o1, o2, o3, o4, o5, o6, o7, o8, o9, o10, o11, o12, o13, o14, o15, o16, o17, o18, o19, o20, o21, o22,
        o23, o24, o25, o26, o27, o28, o29, o30, o31, o32 =
        sunpack(FB, sub, pos)
      d = p1 - o1 bv = p1 - d dd = (p1 - (d + bv)) + (bv - o1)
      if dd == 0 then
        s = h1 + d bv = s - h1 e = (h1 - (s - bv)) + (d - bv)
        t = l1 + e bv = t - l1 f = (l1 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h1, l1 = three_planes(s, t, f)
          if not h1 then return nil, 'general' end
        else
          h1 = s + t bv = h1 - s l1 = (s - (h1 - bv)) + (t - bv)
        end
      else
        s = h1 - o1 bv = h1 - s e = (h1 - (s + bv)) + (bv - o1)
        t = l1 + e bv = t - l1 f = (l1 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h1, l1 = three_planes(s, t, f)
          if not h1 then return nil, 'general' end
        else
          h1 = s + t bv = h1 - s l1 = (s - (h1 - bv)) + (t - bv)
        end
        s = h1 + p1 bv = s - h1 e = (h1 - (s - bv)) + (p1 - bv)
        t = l1 + e bv = t - l1 f = (l1 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h1, l1 = three_planes(s, t, f)
          if not h1 then return nil, 'general' end
        else
          h1 = s + t bv = h1 - s l1 = (s - (h1 - bv)) + (t - bv)
        end
      end
      d = p2 - o2 bv = p2 - d dd = (p2 - (d + bv)) + (bv - o2)
      if dd == 0 then
        s = h2 + d bv = s - h2 e = (h2 - (s - bv)) + (d - bv)
        t = l2 + e bv = t - l2 f = (l2 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h2, l2 = three_planes(s, t, f)
          if not h2 then return nil, 'general' end
        else
          h2 = s + t bv = h2 - s l2 = (s - (h2 - bv)) + (t - bv)
        end
      else
        s = h2 - o2 bv = h2 - s e = (h2 - (s + bv)) + (bv - o2)
        t = l2 + e bv = t - l2 f = (l2 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h2, l2 = three_planes(s, t, f)
          if not h2 then return nil, 'general' end
        else
          h2 = s + t bv = h2 - s l2 = (s - (h2 - bv)) + (t - bv)
        end
        s = h2 + p2 bv = s - h2 e = (h2 - (s - bv)) + (p2 - bv)
        t = l2 + e bv = t - l2 f = (l2 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h2, l2 = three_planes(s, t, f)
          if not h2 then return nil, 'general' end
        else
          h2 = s + t bv = h2 - s l2 = (s - (h2 - bv)) + (t - bv)
        end
      end
      d = p3 - o3 bv = p3 - d dd = (p3 - (d + bv)) + (bv - o3)
      if dd == 0 then
        s = h3 + d bv = s - h3 e = (h3 - (s - bv)) + (d - bv)
        t = l3 + e bv = t - l3 f = (l3 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h3, l3 = three_planes(s, t, f)
          if not h3 then return nil, 'general' end
        else
          h3 = s + t bv = h3 - s l3 = (s - (h3 - bv)) + (t - bv)
        end
      else
        s = h3 - o3 bv = h3 - s e = (h3 - (s + bv)) + (bv - o3)
        t = l3 + e bv = t - l3 f = (l3 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h3, l3 = three_planes(s, t, f)
          if not h3 then return nil, 'general' end
        else
          h3 = s + t bv = h3 - s l3 = (s - (h3 - bv)) + (t - bv)
        end
        s = h3 + p3 bv = s - h3 e = (h3 - (s - bv)) + (p3 - bv)
        t = l3 + e bv = t - l3 f = (l3 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h3, l3 = three_planes(s, t, f)
          if not h3 then return nil, 'general' end
        else
          h3 = s + t bv = h3 - s l3 = (s - (h3 - bv)) + (t - bv)
        end
      end
      d = p4 - o4 bv = p4 - d dd = (p4 - (d + bv)) + (bv - o4)
      if dd == 0 then
        s = h4 + d bv = s - h4 e = (h4 - (s - bv)) + (d - bv)
        t = l4 + e bv = t - l4 f = (l4 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h4, l4 = three_planes(s, t, f)
          if not h4 then return nil, 'general' end
        else
          h4 = s + t bv = h4 - s l4 = (s - (h4 - bv)) + (t - bv)
        end
      else
        s = h4 - o4 bv = h4 - s e = (h4 - (s + bv)) + (bv - o4)
        t = l4 + e bv = t - l4 f = (l4 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h4, l4 = three_planes(s, t, f)
          if not h4 then return nil, 'general' end
        else
          h4 = s + t bv = h4 - s l4 = (s - (h4 - bv)) + (t - bv)
        end
        s = h4 + p4 bv = s - h4 e = (h4 - (s - bv)) + (p4 - bv)
        t = l4 + e bv = t - l4 f = (l4 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h4, l4 = three_planes(s, t, f)
          if not h4 then return nil, 'general' end
        else
          h4 = s + t bv = h4 - s l4 = (s - (h4 - bv)) + (t - bv)
        end
      end
      d = p5 - o5 bv = p5 - d dd = (p5 - (d + bv)) + (bv - o5)
      if dd == 0 then
        s = h5 + d bv = s - h5 e = (h5 - (s - bv)) + (d - bv)
        t = l5 + e bv = t - l5 f = (l5 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h5, l5 = three_planes(s, t, f)
          if not h5 then return nil, 'general' end
        else
          h5 = s + t bv = h5 - s l5 = (s - (h5 - bv)) + (t - bv)
        end
      else
        s = h5 - o5 bv = h5 - s e = (h5 - (s + bv)) + (bv - o5)
        t = l5 + e bv = t - l5 f = (l5 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h5, l5 = three_planes(s, t, f)
          if not h5 then return nil, 'general' end
        else
          h5 = s + t bv = h5 - s l5 = (s - (h5 - bv)) + (t - bv)
        end
        s = h5 + p5 bv = s - h5 e = (h5 - (s - bv)) + (p5 - bv)
        t = l5 + e bv = t - l5 f = (l5 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h5, l5 = three_planes(s, t, f)
          if not h5 then return nil, 'general' end
        else
          h5 = s + t bv = h5 - s l5 = (s - (h5 - bv)) + (t - bv)
        end
      end
      d = p6 - o6 bv = p6 - d dd = (p6 - (d + bv)) + (bv - o6)
      if dd == 0 then
        s = h6 + d bv = s - h6 e = (h6 - (s - bv)) + (d - bv)
        t = l6 + e bv = t - l6 f = (l6 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h6, l6 = three_planes(s, t, f)
          if not h6 then return nil, 'general' end
        else
          h6 = s + t bv = h6 - s l6 = (s - (h6 - bv)) + (t - bv)
        end
      else
        s = h6 - o6 bv = h6 - s e = (h6 - (s + bv)) + (bv - o6)
        t = l6 + e bv = t - l6 f = (l6 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h6, l6 = three_planes(s, t, f)
          if not h6 then return nil, 'general' end
        else
          h6 = s + t bv = h6 - s l6 = (s - (h6 - bv)) + (t - bv)
        end
        s = h6 + p6 bv = s - h6 e = (h6 - (s - bv)) + (p6 - bv)
        t = l6 + e bv = t - l6 f = (l6 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h6, l6 = three_planes(s, t, f)
          if not h6 then return nil, 'general' end
        else
          h6 = s + t bv = h6 - s l6 = (s - (h6 - bv)) + (t - bv)
        end
      end
      d = p7 - o7 bv = p7 - d dd = (p7 - (d + bv)) + (bv - o7)
      if dd == 0 then
        s = h7 + d bv = s - h7 e = (h7 - (s - bv)) + (d - bv)
        t = l7 + e bv = t - l7 f = (l7 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h7, l7 = three_planes(s, t, f)
          if not h7 then return nil, 'general' end
        else
          h7 = s + t bv = h7 - s l7 = (s - (h7 - bv)) + (t - bv)
        end
      else
        s = h7 - o7 bv = h7 - s e = (h7 - (s + bv)) + (bv - o7)
        t = l7 + e bv = t - l7 f = (l7 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h7, l7 = three_planes(s, t, f)
          if not h7 then return nil, 'general' end
        else
          h7 = s + t bv = h7 - s l7 = (s - (h7 - bv)) + (t - bv)
        end
        s = h7 + p7 bv = s - h7 e = (h7 - (s - bv)) + (p7 - bv)
        t = l7 + e bv = t - l7 f = (l7 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h7, l7 = three_planes(s, t, f)
          if not h7 then return nil, 'general' end
        else
          h7 = s + t bv = h7 - s l7 = (s - (h7 - bv)) + (t - bv)
        end
      end
      d = p8 - o8 bv = p8 - d dd = (p8 - (d + bv)) + (bv - o8)
      if dd == 0 then
        s = h8 + d bv = s - h8 e = (h8 - (s - bv)) + (d - bv)
        t = l8 + e bv = t - l8 f = (l8 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h8, l8 = three_planes(s, t, f)
          if not h8 then return nil, 'general' end
        else
          h8 = s + t bv = h8 - s l8 = (s - (h8 - bv)) + (t - bv)
        end
      else
        s = h8 - o8 bv = h8 - s e = (h8 - (s + bv)) + (bv - o8)
        t = l8 + e bv = t - l8 f = (l8 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h8, l8 = three_planes(s, t, f)
          if not h8 then return nil, 'general' end
        else
          h8 = s + t bv = h8 - s l8 = (s - (h8 - bv)) + (t - bv)
        end
        s = h8 + p8 bv = s - h8 e = (h8 - (s - bv)) + (p8 - bv)
        t = l8 + e bv = t - l8 f = (l8 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h8, l8 = three_planes(s, t, f)
          if not h8 then return nil, 'general' end
        else
          h8 = s + t bv = h8 - s l8 = (s - (h8 - bv)) + (t - bv)
        end
      end
      d = p9 - o9 bv = p9 - d dd = (p9 - (d + bv)) + (bv - o9)
      if dd == 0 then
        s = h9 + d bv = s - h9 e = (h9 - (s - bv)) + (d - bv)
        t = l9 + e bv = t - l9 f = (l9 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h9, l9 = three_planes(s, t, f)
          if not h9 then return nil, 'general' end
        else
          h9 = s + t bv = h9 - s l9 = (s - (h9 - bv)) + (t - bv)
        end
      else
        s = h9 - o9 bv = h9 - s e = (h9 - (s + bv)) + (bv - o9)
        t = l9 + e bv = t - l9 f = (l9 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h9, l9 = three_planes(s, t, f)
          if not h9 then return nil, 'general' end
        else
          h9 = s + t bv = h9 - s l9 = (s - (h9 - bv)) + (t - bv)
        end
        s = h9 + p9 bv = s - h9 e = (h9 - (s - bv)) + (p9 - bv)
        t = l9 + e bv = t - l9 f = (l9 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h9, l9 = three_planes(s, t, f)
          if not h9 then return nil, 'general' end
        else
          h9 = s + t bv = h9 - s l9 = (s - (h9 - bv)) + (t - bv)
        end
      end
      d = p10 - o10 bv = p10 - d dd = (p10 - (d + bv)) + (bv - o10)
      if dd == 0 then
        s = h10 + d bv = s - h10 e = (h10 - (s - bv)) + (d - bv)
        t = l10 + e bv = t - l10 f = (l10 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h10, l10 = three_planes(s, t, f)
          if not h10 then return nil, 'general' end
        else
          h10 = s + t bv = h10 - s l10 = (s - (h10 - bv)) + (t - bv)
        end
      else
        s = h10 - o10 bv = h10 - s e = (h10 - (s + bv)) + (bv - o10)
        t = l10 + e bv = t - l10 f = (l10 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h10, l10 = three_planes(s, t, f)
          if not h10 then return nil, 'general' end
        else
          h10 = s + t bv = h10 - s l10 = (s - (h10 - bv)) + (t - bv)
        end
        s = h10 + p10 bv = s - h10 e = (h10 - (s - bv)) + (p10 - bv)
        t = l10 + e bv = t - l10 f = (l10 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h10, l10 = three_planes(s, t, f)
          if not h10 then return nil, 'general' end
        else
          h10 = s + t bv = h10 - s l10 = (s - (h10 - bv)) + (t - bv)
        end
      end
      d = p11 - o11 bv = p11 - d dd = (p11 - (d + bv)) + (bv - o11)
      if dd == 0 then
        s = h11 + d bv = s - h11 e = (h11 - (s - bv)) + (d - bv)
        t = l11 + e bv = t - l11 f = (l11 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h11, l11 = three_planes(s, t, f)
          if not h11 then return nil, 'general' end
        else
          h11 = s + t bv = h11 - s l11 = (s - (h11 - bv)) + (t - bv)
        end
      else
        s = h11 - o11 bv = h11 - s e = (h11 - (s + bv)) + (bv - o11)
        t = l11 + e bv = t - l11 f = (l11 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h11, l11 = three_planes(s, t, f)
          if not h11 then return nil, 'general' end
        else
          h11 = s + t bv = h11 - s l11 = (s - (h11 - bv)) + (t - bv)
        end
        s = h11 + p11 bv = s - h11 e = (h11 - (s - bv)) + (p11 - bv)
        t = l11 + e bv = t - l11 f = (l11 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h11, l11 = three_planes(s, t, f)
          if not h11 then return nil, 'general' end
        else
          h11 = s + t bv = h11 - s l11 = (s - (h11 - bv)) + (t - bv)
        end
      end
      d = p12 - o12 bv = p12 - d dd = (p12 - (d + bv)) + (bv - o12)
      if dd == 0 then
        s = h12 + d bv = s - h12 e = (h12 - (s - bv)) + (d - bv)
        t = l12 + e bv = t - l12 f = (l12 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h12, l12 = three_planes(s, t, f)
          if not h12 then return nil, 'general' end
        else
          h12 = s + t bv = h12 - s l12 = (s - (h12 - bv)) + (t - bv)
        end
      else
        s = h12 - o12 bv = h12 - s e = (h12 - (s + bv)) + (bv - o12)
        t = l12 + e bv = t - l12 f = (l12 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h12, l12 = three_planes(s, t, f)
          if not h12 then return nil, 'general' end
        else
          h12 = s + t bv = h12 - s l12 = (s - (h12 - bv)) + (t - bv)
        end
        s = h12 + p12 bv = s - h12 e = (h12 - (s - bv)) + (p12 - bv)
        t = l12 + e bv = t - l12 f = (l12 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h12, l12 = three_planes(s, t, f)
          if not h12 then return nil, 'general' end
        else
          h12 = s + t bv = h12 - s l12 = (s - (h12 - bv)) + (t - bv)
        end
      end
      d = p13 - o13 bv = p13 - d dd = (p13 - (d + bv)) + (bv - o13)
      if dd == 0 then
        s = h13 + d bv = s - h13 e = (h13 - (s - bv)) + (d - bv)
        t = l13 + e bv = t - l13 f = (l13 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h13, l13 = three_planes(s, t, f)
          if not h13 then return nil, 'general' end
        else
          h13 = s + t bv = h13 - s l13 = (s - (h13 - bv)) + (t - bv)
        end
      else
        s = h13 - o13 bv = h13 - s e = (h13 - (s + bv)) + (bv - o13)
        t = l13 + e bv = t - l13 f = (l13 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h13, l13 = three_planes(s, t, f)
          if not h13 then return nil, 'general' end
        else
          h13 = s + t bv = h13 - s l13 = (s - (h13 - bv)) + (t - bv)
        end
        s = h13 + p13 bv = s - h13 e = (h13 - (s - bv)) + (p13 - bv)
        t = l13 + e bv = t - l13 f = (l13 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h13, l13 = three_planes(s, t, f)
          if not h13 then return nil, 'general' end
        else
          h13 = s + t bv = h13 - s l13 = (s - (h13 - bv)) + (t - bv)
        end
      end
      d = p14 - o14 bv = p14 - d dd = (p14 - (d + bv)) + (bv - o14)
      if dd == 0 then
        s = h14 + d bv = s - h14 e = (h14 - (s - bv)) + (d - bv)
        t = l14 + e bv = t - l14 f = (l14 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h14, l14 = three_planes(s, t, f)
          if not h14 then return nil, 'general' end
        else
          h14 = s + t bv = h14 - s l14 = (s - (h14 - bv)) + (t - bv)
        end
      else
        s = h14 - o14 bv = h14 - s e = (h14 - (s + bv)) + (bv - o14)
        t = l14 + e bv = t - l14 f = (l14 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h14, l14 = three_planes(s, t, f)
          if not h14 then return nil, 'general' end
        else
          h14 = s + t bv = h14 - s l14 = (s - (h14 - bv)) + (t - bv)
        end
        s = h14 + p14 bv = s - h14 e = (h14 - (s - bv)) + (p14 - bv)
        t = l14 + e bv = t - l14 f = (l14 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h14, l14 = three_planes(s, t, f)
          if not h14 then return nil, 'general' end
        else
          h14 = s + t bv = h14 - s l14 = (s - (h14 - bv)) + (t - bv)
        end
      end
      d = p15 - o15 bv = p15 - d dd = (p15 - (d + bv)) + (bv - o15)
      if dd == 0 then
        s = h15 + d bv = s - h15 e = (h15 - (s - bv)) + (d - bv)
        t = l15 + e bv = t - l15 f = (l15 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h15, l15 = three_planes(s, t, f)
          if not h15 then return nil, 'general' end
        else
          h15 = s + t bv = h15 - s l15 = (s - (h15 - bv)) + (t - bv)
        end
      else
        s = h15 - o15 bv = h15 - s e = (h15 - (s + bv)) + (bv - o15)
        t = l15 + e bv = t - l15 f = (l15 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h15, l15 = three_planes(s, t, f)
          if not h15 then return nil, 'general' end
        else
          h15 = s + t bv = h15 - s l15 = (s - (h15 - bv)) + (t - bv)
        end
        s = h15 + p15 bv = s - h15 e = (h15 - (s - bv)) + (p15 - bv)
        t = l15 + e bv = t - l15 f = (l15 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h15, l15 = three_planes(s, t, f)
          if not h15 then return nil, 'general' end
        else
          h15 = s + t bv = h15 - s l15 = (s - (h15 - bv)) + (t - bv)
        end
      end
      d = p16 - o16 bv = p16 - d dd = (p16 - (d + bv)) + (bv - o16)
      if dd == 0 then
        s = h16 + d bv = s - h16 e = (h16 - (s - bv)) + (d - bv)
        t = l16 + e bv = t - l16 f = (l16 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h16, l16 = three_planes(s, t, f)
          if not h16 then return nil, 'general' end
        else
          h16 = s + t bv = h16 - s l16 = (s - (h16 - bv)) + (t - bv)
        end
      else
        s = h16 - o16 bv = h16 - s e = (h16 - (s + bv)) + (bv - o16)
        t = l16 + e bv = t - l16 f = (l16 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h16, l16 = three_planes(s, t, f)
          if not h16 then return nil, 'general' end
        else
          h16 = s + t bv = h16 - s l16 = (s - (h16 - bv)) + (t - bv)
        end
        s = h16 + p16 bv = s - h16 e = (h16 - (s - bv)) + (p16 - bv)
        t = l16 + e bv = t - l16 f = (l16 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h16, l16 = three_planes(s, t, f)
          if not h16 then return nil, 'general' end
        else
          h16 = s + t bv = h16 - s l16 = (s - (h16 - bv)) + (t - bv)
        end
      end
      d = p17 - o17 bv = p17 - d dd = (p17 - (d + bv)) + (bv - o17)
      if dd == 0 then
        s = h17 + d bv = s - h17 e = (h17 - (s - bv)) + (d - bv)
        t = l17 + e bv = t - l17 f = (l17 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h17, l17 = three_planes(s, t, f)
          if not h17 then return nil, 'general' end
        else
          h17 = s + t bv = h17 - s l17 = (s - (h17 - bv)) + (t - bv)
        end
      else
        s = h17 - o17 bv = h17 - s e = (h17 - (s + bv)) + (bv - o17)
        t = l17 + e bv = t - l17 f = (l17 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h17, l17 = three_planes(s, t, f)
          if not h17 then return nil, 'general' end
        else
          h17 = s + t bv = h17 - s l17 = (s - (h17 - bv)) + (t - bv)
        end
        s = h17 + p17 bv = s - h17 e = (h17 - (s - bv)) + (p17 - bv)
        t = l17 + e bv = t - l17 f = (l17 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h17, l17 = three_planes(s, t, f)
          if not h17 then return nil, 'general' end
        else
          h17 = s + t bv = h17 - s l17 = (s - (h17 - bv)) + (t - bv)
        end
      end
      d = p18 - o18 bv = p18 - d dd = (p18 - (d + bv)) + (bv - o18)
      if dd == 0 then
        s = h18 + d bv = s - h18 e = (h18 - (s - bv)) + (d - bv)
        t = l18 + e bv = t - l18 f = (l18 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h18, l18 = three_planes(s, t, f)
          if not h18 then return nil, 'general' end
        else
          h18 = s + t bv = h18 - s l18 = (s - (h18 - bv)) + (t - bv)
        end
      else
        s = h18 - o18 bv = h18 - s e = (h18 - (s + bv)) + (bv - o18)
        t = l18 + e bv = t - l18 f = (l18 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h18, l18 = three_planes(s, t, f)
          if not h18 then return nil, 'general' end
        else
          h18 = s + t bv = h18 - s l18 = (s - (h18 - bv)) + (t - bv)
        end
        s = h18 + p18 bv = s - h18 e = (h18 - (s - bv)) + (p18 - bv)
        t = l18 + e bv = t - l18 f = (l18 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h18, l18 = three_planes(s, t, f)
          if not h18 then return nil, 'general' end
        else
          h18 = s + t bv = h18 - s l18 = (s - (h18 - bv)) + (t - bv)
        end
      end
      d = p19 - o19 bv = p19 - d dd = (p19 - (d + bv)) + (bv - o19)
      if dd == 0 then
        s = h19 + d bv = s - h19 e = (h19 - (s - bv)) + (d - bv)
        t = l19 + e bv = t - l19 f = (l19 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h19, l19 = three_planes(s, t, f)
          if not h19 then return nil, 'general' end
        else
          h19 = s + t bv = h19 - s l19 = (s - (h19 - bv)) + (t - bv)
        end
      else
        s = h19 - o19 bv = h19 - s e = (h19 - (s + bv)) + (bv - o19)
        t = l19 + e bv = t - l19 f = (l19 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h19, l19 = three_planes(s, t, f)
          if not h19 then return nil, 'general' end
        else
          h19 = s + t bv = h19 - s l19 = (s - (h19 - bv)) + (t - bv)
        end
        s = h19 + p19 bv = s - h19 e = (h19 - (s - bv)) + (p19 - bv)
        t = l19 + e bv = t - l19 f = (l19 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h19, l19 = three_planes(s, t, f)
          if not h19 then return nil, 'general' end
        else
          h19 = s + t bv = h19 - s l19 = (s - (h19 - bv)) + (t - bv)
        end
      end
      d = p20 - o20 bv = p20 - d dd = (p20 - (d + bv)) + (bv - o20)
      if dd == 0 then
        s = h20 + d bv = s - h20 e = (h20 - (s - bv)) + (d - bv)
        t = l20 + e bv = t - l20 f = (l20 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h20, l20 = three_planes(s, t, f)
          if not h20 then return nil, 'general' end
        else
          h20 = s + t bv = h20 - s l20 = (s - (h20 - bv)) + (t - bv)
        end
      else
        s = h20 - o20 bv = h20 - s e = (h20 - (s + bv)) + (bv - o20)
        t = l20 + e bv = t - l20 f = (l20 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h20, l20 = three_planes(s, t, f)
          if not h20 then return nil, 'general' end
        else
          h20 = s + t bv = h20 - s l20 = (s - (h20 - bv)) + (t - bv)
        end
        s = h20 + p20 bv = s - h20 e = (h20 - (s - bv)) + (p20 - bv)
        t = l20 + e bv = t - l20 f = (l20 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h20, l20 = three_planes(s, t, f)
          if not h20 then return nil, 'general' end
        else
          h20 = s + t bv = h20 - s l20 = (s - (h20 - bv)) + (t - bv)
        end
      end
      d = p21 - o21 bv = p21 - d dd = (p21 - (d + bv)) + (bv - o21)
      if dd == 0 then
        s = h21 + d bv = s - h21 e = (h21 - (s - bv)) + (d - bv)
        t = l21 + e bv = t - l21 f = (l21 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h21, l21 = three_planes(s, t, f)
          if not h21 then return nil, 'general' end
        else
          h21 = s + t bv = h21 - s l21 = (s - (h21 - bv)) + (t - bv)
        end
      else
        s = h21 - o21 bv = h21 - s e = (h21 - (s + bv)) + (bv - o21)
        t = l21 + e bv = t - l21 f = (l21 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h21, l21 = three_planes(s, t, f)
          if not h21 then return nil, 'general' end
        else
          h21 = s + t bv = h21 - s l21 = (s - (h21 - bv)) + (t - bv)
        end
        s = h21 + p21 bv = s - h21 e = (h21 - (s - bv)) + (p21 - bv)
        t = l21 + e bv = t - l21 f = (l21 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h21, l21 = three_planes(s, t, f)
          if not h21 then return nil, 'general' end
        else
          h21 = s + t bv = h21 - s l21 = (s - (h21 - bv)) + (t - bv)
        end
      end
      d = p22 - o22 bv = p22 - d dd = (p22 - (d + bv)) + (bv - o22)
      if dd == 0 then
        s = h22 + d bv = s - h22 e = (h22 - (s - bv)) + (d - bv)
        t = l22 + e bv = t - l22 f = (l22 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h22, l22 = three_planes(s, t, f)
          if not h22 then return nil, 'general' end
        else
          h22 = s + t bv = h22 - s l22 = (s - (h22 - bv)) + (t - bv)
        end
      else
        s = h22 - o22 bv = h22 - s e = (h22 - (s + bv)) + (bv - o22)
        t = l22 + e bv = t - l22 f = (l22 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h22, l22 = three_planes(s, t, f)
          if not h22 then return nil, 'general' end
        else
          h22 = s + t bv = h22 - s l22 = (s - (h22 - bv)) + (t - bv)
        end
        s = h22 + p22 bv = s - h22 e = (h22 - (s - bv)) + (p22 - bv)
        t = l22 + e bv = t - l22 f = (l22 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h22, l22 = three_planes(s, t, f)
          if not h22 then return nil, 'general' end
        else
          h22 = s + t bv = h22 - s l22 = (s - (h22 - bv)) + (t - bv)
        end
      end
      d = p23 - o23 bv = p23 - d dd = (p23 - (d + bv)) + (bv - o23)
      if dd == 0 then
        s = h23 + d bv = s - h23 e = (h23 - (s - bv)) + (d - bv)
        t = l23 + e bv = t - l23 f = (l23 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h23, l23 = three_planes(s, t, f)
          if not h23 then return nil, 'general' end
        else
          h23 = s + t bv = h23 - s l23 = (s - (h23 - bv)) + (t - bv)
        end
      else
        s = h23 - o23 bv = h23 - s e = (h23 - (s + bv)) + (bv - o23)
        t = l23 + e bv = t - l23 f = (l23 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h23, l23 = three_planes(s, t, f)
          if not h23 then return nil, 'general' end
        else
          h23 = s + t bv = h23 - s l23 = (s - (h23 - bv)) + (t - bv)
        end
        s = h23 + p23 bv = s - h23 e = (h23 - (s - bv)) + (p23 - bv)
        t = l23 + e bv = t - l23 f = (l23 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h23, l23 = three_planes(s, t, f)
          if not h23 then return nil, 'general' end
        else
          h23 = s + t bv = h23 - s l23 = (s - (h23 - bv)) + (t - bv)
        end
      end
      d = p24 - o24 bv = p24 - d dd = (p24 - (d + bv)) + (bv - o24)
      if dd == 0 then
        s = h24 + d bv = s - h24 e = (h24 - (s - bv)) + (d - bv)
        t = l24 + e bv = t - l24 f = (l24 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h24, l24 = three_planes(s, t, f)
          if not h24 then return nil, 'general' end
        else
          h24 = s + t bv = h24 - s l24 = (s - (h24 - bv)) + (t - bv)
        end
      else
        s = h24 - o24 bv = h24 - s e = (h24 - (s + bv)) + (bv - o24)
        t = l24 + e bv = t - l24 f = (l24 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h24, l24 = three_planes(s, t, f)
          if not h24 then return nil, 'general' end
        else
          h24 = s + t bv = h24 - s l24 = (s - (h24 - bv)) + (t - bv)
        end
        s = h24 + p24 bv = s - h24 e = (h24 - (s - bv)) + (p24 - bv)
        t = l24 + e bv = t - l24 f = (l24 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h24, l24 = three_planes(s, t, f)
          if not h24 then return nil, 'general' end
        else
          h24 = s + t bv = h24 - s l24 = (s - (h24 - bv)) + (t - bv)
        end
      end
      d = p25 - o25 bv = p25 - d dd = (p25 - (d + bv)) + (bv - o25)
      if dd == 0 then
        s = h25 + d bv = s - h25 e = (h25 - (s - bv)) + (d - bv)
        t = l25 + e bv = t - l25 f = (l25 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h25, l25 = three_planes(s, t, f)
          if not h25 then return nil, 'general' end
        else
          h25 = s + t bv = h25 - s l25 = (s - (h25 - bv)) + (t - bv)
        end
      else
        s = h25 - o25 bv = h25 - s e = (h25 - (s + bv)) + (bv - o25)
        t = l25 + e bv = t - l25 f = (l25 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h25, l25 = three_planes(s, t, f)
          if not h25 then return nil, 'general' end
        else
          h25 = s + t bv = h25 - s l25 = (s - (h25 - bv)) + (t - bv)
        end
        s = h25 + p25 bv = s - h25 e = (h25 - (s - bv)) + (p25 - bv)
        t = l25 + e bv = t - l25 f = (l25 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h25, l25 = three_planes(s, t, f)
          if not h25 then return nil, 'general' end
        else
          h25 = s + t bv = h25 - s l25 = (s - (h25 - bv)) + (t - bv)
        end
      end
      d = p26 - o26 bv = p26 - d dd = (p26 - (d + bv)) + (bv - o26)
      if dd == 0 then
        s = h26 + d bv = s - h26 e = (h26 - (s - bv)) + (d - bv)
        t = l26 + e bv = t - l26 f = (l26 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h26, l26 = three_planes(s, t, f)
          if not h26 then return nil, 'general' end
        else
          h26 = s + t bv = h26 - s l26 = (s - (h26 - bv)) + (t - bv)
        end
      else
        s = h26 - o26 bv = h26 - s e = (h26 - (s + bv)) + (bv - o26)
        t = l26 + e bv = t - l26 f = (l26 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h26, l26 = three_planes(s, t, f)
          if not h26 then return nil, 'general' end
        else
          h26 = s + t bv = h26 - s l26 = (s - (h26 - bv)) + (t - bv)
        end
        s = h26 + p26 bv = s - h26 e = (h26 - (s - bv)) + (p26 - bv)
        t = l26 + e bv = t - l26 f = (l26 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h26, l26 = three_planes(s, t, f)
          if not h26 then return nil, 'general' end
        else
          h26 = s + t bv = h26 - s l26 = (s - (h26 - bv)) + (t - bv)
        end
      end
      d = p27 - o27 bv = p27 - d dd = (p27 - (d + bv)) + (bv - o27)
      if dd == 0 then
        s = h27 + d bv = s - h27 e = (h27 - (s - bv)) + (d - bv)
        t = l27 + e bv = t - l27 f = (l27 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h27, l27 = three_planes(s, t, f)
          if not h27 then return nil, 'general' end
        else
          h27 = s + t bv = h27 - s l27 = (s - (h27 - bv)) + (t - bv)
        end
      else
        s = h27 - o27 bv = h27 - s e = (h27 - (s + bv)) + (bv - o27)
        t = l27 + e bv = t - l27 f = (l27 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h27, l27 = three_planes(s, t, f)
          if not h27 then return nil, 'general' end
        else
          h27 = s + t bv = h27 - s l27 = (s - (h27 - bv)) + (t - bv)
        end
        s = h27 + p27 bv = s - h27 e = (h27 - (s - bv)) + (p27 - bv)
        t = l27 + e bv = t - l27 f = (l27 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h27, l27 = three_planes(s, t, f)
          if not h27 then return nil, 'general' end
        else
          h27 = s + t bv = h27 - s l27 = (s - (h27 - bv)) + (t - bv)
        end
      end
      d = p28 - o28 bv = p28 - d dd = (p28 - (d + bv)) + (bv - o28)
      if dd == 0 then
        s = h28 + d bv = s - h28 e = (h28 - (s - bv)) + (d - bv)
        t = l28 + e bv = t - l28 f = (l28 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h28, l28 = three_planes(s, t, f)
          if not h28 then return nil, 'general' end
        else
          h28 = s + t bv = h28 - s l28 = (s - (h28 - bv)) + (t - bv)
        end
      else
        s = h28 - o28 bv = h28 - s e = (h28 - (s + bv)) + (bv - o28)
        t = l28 + e bv = t - l28 f = (l28 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h28, l28 = three_planes(s, t, f)
          if not h28 then return nil, 'general' end
        else
          h28 = s + t bv = h28 - s l28 = (s - (h28 - bv)) + (t - bv)
        end
        s = h28 + p28 bv = s - h28 e = (h28 - (s - bv)) + (p28 - bv)
        t = l28 + e bv = t - l28 f = (l28 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h28, l28 = three_planes(s, t, f)
          if not h28 then return nil, 'general' end
        else
          h28 = s + t bv = h28 - s l28 = (s - (h28 - bv)) + (t - bv)
        end
      end
      d = p29 - o29 bv = p29 - d dd = (p29 - (d + bv)) + (bv - o29)
      if dd == 0 then
        s = h29 + d bv = s - h29 e = (h29 - (s - bv)) + (d - bv)
        t = l29 + e bv = t - l29 f = (l29 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h29, l29 = three_planes(s, t, f)
          if not h29 then return nil, 'general' end
        else
          h29 = s + t bv = h29 - s l29 = (s - (h29 - bv)) + (t - bv)
        end
      else
        s = h29 - o29 bv = h29 - s e = (h29 - (s + bv)) + (bv - o29)
        t = l29 + e bv = t - l29 f = (l29 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h29, l29 = three_planes(s, t, f)
          if not h29 then return nil, 'general' end
        else
          h29 = s + t bv = h29 - s l29 = (s - (h29 - bv)) + (t - bv)
        end
        s = h29 + p29 bv = s - h29 e = (h29 - (s - bv)) + (p29 - bv)
        t = l29 + e bv = t - l29 f = (l29 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h29, l29 = three_planes(s, t, f)
          if not h29 then return nil, 'general' end
        else
          h29 = s + t bv = h29 - s l29 = (s - (h29 - bv)) + (t - bv)
        end
      end
      d = p30 - o30 bv = p30 - d dd = (p30 - (d + bv)) + (bv - o30)
      if dd == 0 then
        s = h30 + d bv = s - h30 e = (h30 - (s - bv)) + (d - bv)
        t = l30 + e bv = t - l30 f = (l30 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h30, l30 = three_planes(s, t, f)
          if not h30 then return nil, 'general' end
        else
          h30 = s + t bv = h30 - s l30 = (s - (h30 - bv)) + (t - bv)
        end
      else
        s = h30 - o30 bv = h30 - s e = (h30 - (s + bv)) + (bv - o30)
        t = l30 + e bv = t - l30 f = (l30 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h30, l30 = three_planes(s, t, f)
          if not h30 then return nil, 'general' end
        else
          h30 = s + t bv = h30 - s l30 = (s - (h30 - bv)) + (t - bv)
        end
        s = h30 + p30 bv = s - h30 e = (h30 - (s - bv)) + (p30 - bv)
        t = l30 + e bv = t - l30 f = (l30 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h30, l30 = three_planes(s, t, f)
          if not h30 then return nil, 'general' end
        else
          h30 = s + t bv = h30 - s l30 = (s - (h30 - bv)) + (t - bv)
        end
      end
      d = p31 - o31 bv = p31 - d dd = (p31 - (d + bv)) + (bv - o31)
      if dd == 0 then
        s = h31 + d bv = s - h31 e = (h31 - (s - bv)) + (d - bv)
        t = l31 + e bv = t - l31 f = (l31 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h31, l31 = three_planes(s, t, f)
          if not h31 then return nil, 'general' end
        else
          h31 = s + t bv = h31 - s l31 = (s - (h31 - bv)) + (t - bv)
        end
      else
        s = h31 - o31 bv = h31 - s e = (h31 - (s + bv)) + (bv - o31)
        t = l31 + e bv = t - l31 f = (l31 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h31, l31 = three_planes(s, t, f)
          if not h31 then return nil, 'general' end
        else
          h31 = s + t bv = h31 - s l31 = (s - (h31 - bv)) + (t - bv)
        end
        s = h31 + p31 bv = s - h31 e = (h31 - (s - bv)) + (p31 - bv)
        t = l31 + e bv = t - l31 f = (l31 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h31, l31 = three_planes(s, t, f)
          if not h31 then return nil, 'general' end
        else
          h31 = s + t bv = h31 - s l31 = (s - (h31 - bv)) + (t - bv)
        end
      end
      d = p32 - o32 bv = p32 - d dd = (p32 - (d + bv)) + (bv - o32)
      if dd == 0 then
        s = h32 + d bv = s - h32 e = (h32 - (s - bv)) + (d - bv)
        t = l32 + e bv = t - l32 f = (l32 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h32, l32 = three_planes(s, t, f)
          if not h32 then return nil, 'general' end
        else
          h32 = s + t bv = h32 - s l32 = (s - (h32 - bv)) + (t - bv)
        end
      else
        s = h32 - o32 bv = h32 - s e = (h32 - (s + bv)) + (bv - o32)
        t = l32 + e bv = t - l32 f = (l32 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h32, l32 = three_planes(s, t, f)
          if not h32 then return nil, 'general' end
        else
          h32 = s + t bv = h32 - s l32 = (s - (h32 - bv)) + (t - bv)
        end
        s = h32 + p32 bv = s - h32 e = (h32 - (s - bv)) + (p32 - bv)
        t = l32 + e bv = t - l32 f = (l32 - (t - bv)) + (e - bv)
        if f ~= 0 then
          h32, l32 = three_planes(s, t, f)
          if not h32 then return nil, 'general' end
        else
          h32 = s + t bv = h32 - s l32 = (s - (h32 - bv)) + (t - bv)
        end
      end
    else -- a shard's first slot: the payload in
      s = h1 + p1 bv = s - h1 e = (h1 - (s - bv)) + (p1 - bv)
      t = l1 + e bv = t - l1 f = (l1 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h1, l1 = three_planes(s, t, f)
        if not h1 then return nil, 'general' end
      else
        h1 = s + t bv = h1 - s l1 = (s - (h1 - bv)) + (t - bv)
      end
      s = h2 + p2 bv = s - h2 e = (h2 - (s - bv)) + (p2 - bv)
      t = l2 + e bv = t - l2 f = (l2 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h2, l2 = three_planes(s, t, f)
        if not h2 then return nil, 'general' end
      else
        h2 = s + t bv = h2 - s l2 = (s - (h2 - bv)) + (t - bv)
      end
      s = h3 + p3 bv = s - h3 e = (h3 - (s - bv)) + (p3 - bv)
      t = l3 + e bv = t - l3 f = (l3 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h3, l3 = three_planes(s, t, f)
        if not h3 then return nil, 'general' end
      else
        h3 = s + t bv = h3 - s l3 = (s - (h3 - bv)) + (t - bv)
      end
      s = h4 + p4 bv = s - h4 e = (h4 - (s - bv)) + (p4 - bv)
      t = l4 + e bv = t - l4 f = (l4 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h4, l4 = three_planes(s, t, f)
        if not h4 then return nil, 'general' end
      else
        h4 = s + t bv = h4 - s l4 = (s - (h4 - bv)) + (t - bv)
      end
      s = h5 + p5 bv = s - h5 e = (h5 - (s - bv)) + (p5 - bv)
      t = l5 + e bv = t - l5 f = (l5 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h5, l5 = three_planes(s, t, f)
        if not h5 then return nil, 'general' end
      else
        h5 = s + t bv = h5 - s l5 = (s - (h5 - bv)) + (t - bv)
      end
      s = h6 + p6 bv = s - h6 e = (h6 - (s - bv)) + (p6 - bv)
      t = l6 + e bv = t - l6 f = (l6 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h6, l6 = three_planes(s, t, f)
        if not h6 then return nil, 'general' end
      else
        h6 = s + t bv = h6 - s l6 = (s - (h6 - bv)) + (t - bv)
      end
      s = h7 + p7 bv = s - h7 e = (h7 - (s - bv)) + (p7 - bv)
      t = l7 + e bv = t - l7 f = (l7 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h7, l7 = three_planes(s, t, f)
        if not h7 then return nil, 'general' end
      else
        h7 = s + t bv = h7 - s l7 = (s - (h7 - bv)) + (t - bv)
      end
      s = h8 + p8 bv = s - h8 e = (h8 - (s - bv)) + (p8 - bv)
      t = l8 + e bv = t - l8 f = (l8 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h8, l8 = three_planes(s, t, f)
        if not h8 then return nil, 'general' end
      else
        h8 = s + t bv = h8 - s l8 = (s - (h8 - bv)) + (t - bv)
      end
      s = h9 + p9 bv = s - h9 e = (h9 - (s - bv)) + (p9 - bv)
      t = l9 + e bv = t - l9 f = (l9 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h9, l9 = three_planes(s, t, f)
        if not h9 then return nil, 'general' end
      else
        h9 = s + t bv = h9 - s l9 = (s - (h9 - bv)) + (t - bv)
      end
      s = h10 + p10 bv = s - h10 e = (h10 - (s - bv)) + (p10 - bv)
      t = l10 + e bv = t - l10 f = (l10 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h10, l10 = three_planes(s, t, f)
        if not h10 then return nil, 'general' end
      else
        h10 = s + t bv = h10 - s l10 = (s - (h10 - bv)) + (t - bv)
      end
      s = h11 + p11 bv = s - h11 e = (h11 - (s - bv)) + (p11 - bv)
      t = l11 + e bv = t - l11 f = (l11 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h11, l11 = three_planes(s, t, f)
        if not h11 then return nil, 'general' end
      else
        h11 = s + t bv = h11 - s l11 = (s - (h11 - bv)) + (t - bv)
      end
      s = h12 + p12 bv = s - h12 e = (h12 - (s - bv)) + (p12 - bv)
      t = l12 + e bv = t - l12 f = (l12 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h12, l12 = three_planes(s, t, f)
        if not h12 then return nil, 'general' end
      else
        h12 = s + t bv = h12 - s l12 = (s - (h12 - bv)) + (t - bv)
      end
      s = h13 + p13 bv = s - h13 e = (h13 - (s - bv)) + (p13 - bv)
      t = l13 + e bv = t - l13 f = (l13 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h13, l13 = three_planes(s, t, f)
        if not h13 then return nil, 'general' end
      else
        h13 = s + t bv = h13 - s l13 = (s - (h13 - bv)) + (t - bv)
      end
      s = h14 + p14 bv = s - h14 e = (h14 - (s - bv)) + (p14 - bv)
      t = l14 + e bv = t - l14 f = (l14 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h14, l14 = three_planes(s, t, f)
        if not h14 then return nil, 'general' end
      else
        h14 = s + t bv = h14 - s l14 = (s - (h14 - bv)) + (t - bv)
      end
      s = h15 + p15 bv = s - h15 e = (h15 - (s - bv)) + (p15 - bv)
      t = l15 + e bv = t - l15 f = (l15 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h15, l15 = three_planes(s, t, f)
        if not h15 then return nil, 'general' end
      else
        h15 = s + t bv = h15 - s l15 = (s - (h15 - bv)) + (t - bv)
      end
      s = h16 + p16 bv = s - h16 e = (h16 - (s - bv)) + (p16 - bv)
      t = l16 + e bv = t - l16 f = (l16 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h16, l16 = three_planes(s, t, f)
        if not h16 then return nil, 'general' end
      else
        h16 = s + t bv = h16 - s l16 = (s - (h16 - bv)) + (t - bv)
      end
      s = h17 + p17 bv = s - h17 e = (h17 - (s - bv)) + (p17 - bv)
      t = l17 + e bv = t - l17 f = (l17 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h17, l17 = three_planes(s, t, f)
        if not h17 then return nil, 'general' end
      else
        h17 = s + t bv = h17 - s l17 = (s - (h17 - bv)) + (t - bv)
      end
      s = h18 + p18 bv = s - h18 e = (h18 - (s - bv)) + (p18 - bv)
      t = l18 + e bv = t - l18 f = (l18 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h18, l18 = three_planes(s, t, f)
        if not h18 then return nil, 'general' end
      else
        h18 = s + t bv = h18 - s l18 = (s - (h18 - bv)) + (t - bv)
      end
      s = h19 + p19 bv = s - h19 e = (h19 - (s - bv)) + (p19 - bv)
      t = l19 + e bv = t - l19 f = (l19 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h19, l19 = three_planes(s, t, f)
        if not h19 then return nil, 'general' end
      else
        h19 = s + t bv = h19 - s l19 = (s - (h19 - bv)) + (t - bv)
      end
      s = h20 + p20 bv = s - h20 e = (h20 - (s - bv)) + (p20 - bv)
      t = l20 + e bv = t - l20 f = (l20 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h20, l20 = three_planes(s, t, f)
        if not h20 then return nil, 'general' end
      else
        h20 = s + t bv = h20 - s l20 = (s - (h20 - bv)) + (t - bv)
      end
      s = h21 + p21 bv = s - h21 e = (h21 - (s - bv)) + (p21 - bv)
      t = l21 + e bv = t - l21 f = (l21 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h21, l21 = three_planes(s, t, f)
        if not h21 then return nil, 'general' end
      else
        h21 = s + t bv = h21 - s l21 = (s - (h21 - bv)) + (t - bv)
      end
      s = h22 + p22 bv = s - h22 e = (h22 - (s - bv)) + (p22 - bv)
      t = l22 + e bv = t - l22 f = (l22 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h22, l22 = three_planes(s, t, f)
        if not h22 then return nil, 'general' end
      else
        h22 = s + t bv = h22 - s l22 = (s - (h22 - bv)) + (t - bv)
      end
      s = h23 + p23 bv = s - h23 e = (h23 - (s - bv)) + (p23 - bv)
      t = l23 + e bv = t - l23 f = (l23 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h23, l23 = three_planes(s, t, f)
        if not h23 then return nil, 'general' end
      else
        h23 = s + t bv = h23 - s l23 = (s - (h23 - bv)) + (t - bv)
      end
      s = h24 + p24 bv = s - h24 e = (h24 - (s - bv)) + (p24 - bv)
      t = l24 + e bv = t - l24 f = (l24 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h24, l24 = three_planes(s, t, f)
        if not h24 then return nil, 'general' end
      else
        h24 = s + t bv = h24 - s l24 = (s - (h24 - bv)) + (t - bv)
      end
      s = h25 + p25 bv = s - h25 e = (h25 - (s - bv)) + (p25 - bv)
      t = l25 + e bv = t - l25 f = (l25 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h25, l25 = three_planes(s, t, f)
        if not h25 then return nil, 'general' end
      else
        h25 = s + t bv = h25 - s l25 = (s - (h25 - bv)) + (t - bv)
      end
      s = h26 + p26 bv = s - h26 e = (h26 - (s - bv)) + (p26 - bv)
      t = l26 + e bv = t - l26 f = (l26 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h26, l26 = three_planes(s, t, f)
        if not h26 then return nil, 'general' end
      else
        h26 = s + t bv = h26 - s l26 = (s - (h26 - bv)) + (t - bv)
      end
      s = h27 + p27 bv = s - h27 e = (h27 - (s - bv)) + (p27 - bv)
      t = l27 + e bv = t - l27 f = (l27 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h27, l27 = three_planes(s, t, f)
        if not h27 then return nil, 'general' end
      else
        h27 = s + t bv = h27 - s l27 = (s - (h27 - bv)) + (t - bv)
      end
      s = h28 + p28 bv = s - h28 e = (h28 - (s - bv)) + (p28 - bv)
      t = l28 + e bv = t - l28 f = (l28 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h28, l28 = three_planes(s, t, f)
        if not h28 then return nil, 'general' end
      else
        h28 = s + t bv = h28 - s l28 = (s - (h28 - bv)) + (t - bv)
      end
      s = h29 + p29 bv = s - h29 e = (h29 - (s - bv)) + (p29 - bv)
      t = l29 + e bv = t - l29 f = (l29 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h29, l29 = three_planes(s, t, f)
        if not h29 then return nil, 'general' end
      else
        h29 = s + t bv = h29 - s l29 = (s - (h29 - bv)) + (t - bv)
      end
      s = h30 + p30 bv = s - h30 e = (h30 - (s - bv)) + (p30 - bv)
      t = l30 + e bv = t - l30 f = (l30 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h30, l30 = three_planes(s, t, f)
        if not h30 then return nil, 'general' end
      else
        h30 = s + t bv = h30 - s l30 = (s - (h30 - bv)) + (t - bv)
      end
      s = h31 + p31 bv = s - h31 e = (h31 - (s - bv)) + (p31 - bv)
      t = l31 + e bv = t - l31 f = (l31 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h31, l31 = three_planes(s, t, f)
        if not h31 then return nil, 'general' end
      else
        h31 = s + t bv = h31 - s l31 = (s - (h31 - bv)) + (t - bv)
      end
      s = h32 + p32 bv = s - h32 e = (h32 - (s - bv)) + (p32 - bv)
      t = l32 + e bv = t - l32 f = (l32 - (t - bv)) + (e - bv)
      if f ~= 0 then
        h32, l32 = three_planes(s, t, f)
        if not h32 then return nil, 'general' end
      else
        h32 = s + t bv = h32 - s l32 = (s - (h32 - bv)) + (t - bv)
      end
    end
    his[blk] =
      spack(FB, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15, h16, h17, h18, h19, h20, h21, h22,
        h23, h24, h25, h26, h27, h28, h29, h30, h31, h32)
    los[blk] =
      spack(FB, l1, l2, l3, l4, l5, l6, l7, l8, l9, l10, l11, l12, l13, l14, l15, l16, l17, l18, l19, l20, l21, l22,
        l23, l24, l25, l26, l27, l28, l29, l30, l31, l32)
    -- the moments' cheap look: with counts of 0 or >= 1 a mean is finite, and its square (with sums of
    -- squares) too when the sums are below 2^511
    if sumsq and base + BLOCK > cs and base < cs + size then
      sq =
        h1 * h1 + h2 * h2 + h3 * h3 + h4 * h4 + h5 * h5 + h6 * h6 + h7 * h7 + h8 * h8 + h9 * h9 + h10 * h10
          + h11 * h11 + h12 * h12 + h13 * h13 + h14 * h14 + h15 * h15 + h16 * h16 + h17 * h17 + h18 * h18
          + h19 * h19 + h20 * h20 + h21 * h21 + h22 * h22 + h23 * h23 + h24 * h24 + h25 * h25 + h26 * h26
          + h27 * h27 + h28 * h28 + h29 * h29 + h30 * h30 + h31 * h31 + h32 * h32
      if sq - sq ~= 0 then look = false end
    end
    if base < cs and mmin(h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15, h16, h17, h18, h19, h20,
      h21, h22, h23, h24, h25, h26, h27, h28, h29, h30, h31, h32) < 1 then
      for _, n in ipairs({h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11, h12, h13, h14, h15, h16, h17, h18, h19, h20,
      h21, h22, h23, h24, h25, h26, h27, h28, h29, h30, h31, h32}) do
        if n > 0 and n < 1 then look = false end
      end
    end
    base, pos = base + BLOCK, pos + BLOCK * 8
  end
  return look
end
-- END GENERATED exact_blocks

local function exact_fast(st, payload, hi, lo, sub)
  local width = st.width
  local head = width % BLOCK
  local his, los, look = {}, {}, true
  if head > 0 then
    local h, l, flag = exact_head(st, payload, hi, lo, sub, head)
    if not h then return nil, l end
    his[1], los[1], look = h, l, flag
  end
  local rest, why = exact_blocks(st, payload, hi, lo, sub, head * 8 + 1, head, head > 0 and 1 or 0, his, los)
  if rest == nil then return nil, why end
  local agg = join(his)
  if not (look and rest) then
    local problem = moments_problem(agg, width, st.cs, st.size, st.sumsq)
    if problem then return nil, {'non_finite', st.name, problem} end
  end
  return agg, join(los)
end

-- the key's declaration checked, and who is live after this fold (the envelope judged who left:
-- item.life, lifecycle.lua)
local function merge_live(item, spec, decl, fold) -- nil and the key's working state, or the rejection
  local name, width, count_size, size = item.name, decl.width, decl.count_size, decl.size
  local sumsq = width == count_size + 2 * size -- (count || sum || sumsq, or count || sum)
  if count_size < 1 or (width ~= count_size + size and not sumsq) then
    return reject('corrupt_state', name, 'the key\'s declaration is not a merge key\'s (width ' .. width ..
      ', count_size ' .. count_size .. ', size ' .. size .. ')')
  end
  item.width, item.count_size, item.size = width, count_size, size
  local life = item.life
  if life.problem then return refuse(item, 'corrupt_state', life.problem) end
  item.rebuild = spec[8] ~= LAYOUT
  item.prior, item.forget, item.departed = life.prior, life.forget, life.history
  item.incarnation = spec[7]
  local live = item.rebuild and LIFECYCLE.live(life) or NONE -- (a rebuild re-adds every live slot)
  return nil, {sumsq = sumsq, idname = life.idname, was_writer = life.was_writer, live = live, me = life.me,
    lifecycle = decl.lifecycle}
end

-- The stored planes of an exact sum: {hi, lo planes...}, or nil and the problem
local function planes(hi, lo, whole, name)
  if not lo then return nil, 'stored ' .. name .. '_lo is missing' end
  if #lo == 0 or #lo % whole ~= 0 then
    return nil, 'stored ' .. name .. '_lo is ' .. #lo .. ' bytes, the key needs a whole number of rows of ' .. whole
  end
  local out = {hi}
  for first = 1, #lo, whole do out[#out + 1] = string.sub(lo, first, first + whole - 1) end
  return out
end

-- What the fold reads, the history it retires, and the new exact sum
local function merge_sums(item, spec, resumed, k, fold)
  local width, cs, size, name, payload, me, idname = item.width, item.count_size, item.size, item.name,
    item.payload, k.me, k.idname
  local whole = width * 8
  local plan = {n = 0, fields = {}, sizes = {}, owners = {}, got = {}, slots = {}}
  local got, slots = plan.got, plan.slots
  local retiring = spec[7] and spec[7] ~= fold.inc and not resumed and k.lifecycle ~= 'state'
  local departing = #item.forget > 0 and k.lifecycle ~= 'state' -- (history slots whose shards are gone: retired)
  local rebuild = item.rebuild
  ask(plan, 'agg', whole)
  ask(plan, 'agg_lo', false)
  if k.was_writer then ask(plan, fold.own.slot, whole, me) end
  if retiring or departing or rebuild then ask(plan, 'retired', whole); ask(plan, 'retired_lo', false) end
  for j = 1, #item.forget do local id = item.forget[j] ask(plan, 'slot:' .. idname[id], whole, id) end
  if rebuild then
    for j = 1, #k.live do local id = k.live[j] if id ~= me then ask(plan, 'slot:' .. idname[id], whole, id) end end
  end
  local bad = fetch(plan, item, idname)
  if bad then return bad end
  -- the history: a new life of a history key that did not resume retires its previous slot
  local retired_planes
  if got['retired'] and rebuild then
    -- an earlier layout's history (whose fold may have changed it and left a rest that is no longer
    -- its rest): one plane, taken as exact, and written back in this layout's planes
    retired_planes = exact_general({got['retired']}, {}, {}, width)
    item.retired = retired_planes
  elseif got['retired'] then
    local why
    retired_planes, why = planes(got['retired'], got['retired_lo'], whole, 'retired')
    if not retired_planes then return refuse(item, 'corrupt_state', why) end
  end
  local old = retiring and slots[me]
  if old then
    retired_planes = exact_general(retired_planes or {}, {old}, {}, width)
    local why = moments_problem(retired_planes[1], width, cs, size, k.sumsq)
    if why then return refuse(item, 'non_finite', why) end
    item.retired = retired_planes
  end
  local subs = {}
  if slots[me] and not retiring then subs[1] = slots[me] end
  -- (departed history slots move into the retired planes as they are: the exact sum does not change)
  local gone = departing and {} or subs
  for j = 1, #item.forget do gone[#gone + 1] = slots[item.forget[j]] end
  if departing then retired_planes = exact_general(retired_planes or {}, gone, {}, width) item.retired = retired_planes end
  local result
  if rebuild then
    local why = payload_problem(name, payload, width, cs, size)
    if why then return reject(why[1], why[2], why[3]) end
    local adds = {payload}
    for j = 1, #k.live do local id = k.live[j] if id ~= me then adds[#adds + 1] = slots[id] end end
    result = exact_general(retired_planes or {}, adds, {}, width)
  else
    local stored, why = planes(got['agg'], got['agg_lo'], whole, 'agg')
    if not stored then return refuse(item, 'corrupt_state', why) end
    local agg, lo
    if #stored == 2 and #subs <= 1 then
      agg, lo = exact_fast({name = name, width = width, cs = cs, size = size, sumsq = k.sumsq}, payload,
        stored[1], stored[2], subs[1])
      if not agg and lo ~= 'general' then return reject(lo[1], lo[2], lo[3]) end
    end
    if agg then
      result = {agg, lo}
    else
      local why = payload_problem(name, payload, width, cs, size)
      if why then return reject(why[1], why[2], why[3]) end
      result = exact_general(stored, {payload}, subs, width)
    end
  end
  if #result ~= 2 or rebuild then -- (the usual path checked the moments on its way)
    local why = moments_problem(result[1], width, cs, size, k.sumsq)
    if why then return refuse(item, 'non_finite', why) end
  end
  item.agg = result[1]
  local rest = {}
  for r = 2, #result do rest[r - 1] = result[r] end
  item.agg_lo = join(rest)
end

-- the key-meta fields the check reads beside the envelope's (spec[1] .. spec[3]) and the life
-- cycle's (spec[4] .. spec[6], a key with slots): spec[7], spec[8]
local function reads(own_fields)
  return own_fields.slot_incarnation, 'sums_layout'
end

local function check(item, spec, decl, resumed, fold)
  -- (every field the apply reads is set by this check, or false: the item is the VM's, see ITEMS)
  item.width, item.count_size, item.size, item.rebuild, item.forget, item.incarnation, item.retired, item.agg,
    item.agg_lo, item.prior, item.departed = false, false, false, false, false, false, false, false, false, false, false
  local bad, k = merge_live(item, spec, decl, fold)
  if bad then return bad end
  return merge_sums(item, spec, resumed, k, fold)
end

local function apply(item, fold)
  for _, id in ipairs(item.forget) do redis.call('HDEL', item.data, 'slot:' .. string.format('%d', id)) end
  if item.retired then
    local rest = {}
    for r = 2, #item.retired do rest[r - 1] = item.retired[r] end
    redis.call('HSET', item.data, 'retired', item.retired[1], 'retired_lo', join(rest))
  end
  if item.rebuild then -- an earlier layout's sums (sub-groups of 4 ids, groups of 16): gone, this fold re-made the sum
    local gone = {}
    for _, id in ipairs(item.prior) do
      local q, g = string.format('%d', (id - id % 4) / 4), string.format('%d', (id - id % 16) / 16)
      gone[#gone + 1] = 'counts:slot:' .. id
      gone[#gone + 1], gone[#gone + 2], gone[#gone + 3], gone[#gone + 4] = 'sub:' .. q, 'counts:sub:' .. q,
        'group:' .. g, 'counts:group:' .. g
    end
    for first = 1, #gone, 4096 do redis.call('HDEL', item.data, unpack(gone, first, math.min(first + 4095, #gone))) end
    redis.call('HSET', item.meta, 'sums_layout', LAYOUT)
  end
  redis.call('HSET', item.data, 'agg', item.agg, 'agg_lo', item.agg_lo, fold.own.slot, item.payload)
  if item.incarnation ~= fold.inc then redis.call('HSET', item.meta, fold.own.slot_incarnation, fold.inc) end
  redis.call('HSET', item.meta, 'version', string.format('%d', item.version), 'updated_at_us', fold.now_s,
    fold.own.slot_seq, fold.seq, fold.own.slot_at, fold.now_s)
  -- (the VM keeps the item: let go of the vectors)
  item.retired, item.agg, item.agg_lo = false, false, false
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

return {reads = reads, check = check, apply = apply, pull = pull, slots = true}
