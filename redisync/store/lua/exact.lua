-- exact.lua: exact sums of float64 vectors, kept as canonical planes (c1 = fl(S), c2 = fl(S - c1), ...):
-- the arithmetic merge.lua's exact pooled sum is made of, with no Redis in it (the Python twin:
-- redisync/store/semantics/merge.py's exact_planes). Loaded after shared.lua, before the semantics'
-- modules, which take its functions from EXACT.

local mabs = math.abs

-- Exact sums of any length ------------------------------------------------------------------------
-- An expansion: a table of non-overlapping floats in increasing magnitude whose exact sum is the
-- value (Shewchuk, "Adaptive precision floating-point arithmetic", 1997).

-- ps + x, exactly, in place (each step an exact two-sum; zeros dropped)
local function grow(ps, x)
  local i, n = 0, #ps
  for k = 1, n do
    local y = ps[k]
    if mabs(x) < mabs(y) then x, y = y, x end
    local hi = x + y
    local lo = y - (hi - x)
    if lo ~= 0 then i = i + 1; ps[i] = lo end
    x = hi
  end
  for k = n, i + 2, -1 do ps[k] = nil end
  ps[i + 1] = x
end

-- the expansion's value correctly rounded (to nearest, ties to even)
local function rounded(ps)
  local n = #ps
  if n == 0 then return 0.0 end
  local hi, lo = ps[n], 0.0
  n = n - 1
  while n > 0 do
    local x, y = hi, ps[n]
    n = n - 1
    hi = x + y
    lo = y - (hi - x)
    if lo ~= 0 then break end
  end
  -- half-way: the rest below lo pushes the rounding the way of its sign
  if n > 0 and ((lo < 0 and ps[n] < 0) or (lo > 0 and ps[n] > 0)) then
    local y = lo * 2
    local x = hi + y
    if y == x - hi then hi = x end
  end
  return hi
end

-- s + t + f exactly (the usual fold's pieces of one element when the second plane's sum had an error)
-- in two canonical planes: fl(S) and S - fl(S); nil where the sum needs a third plane
local function three_planes(s, t, f)
  local ps = {}
  grow(ps, f); grow(ps, t); grow(ps, s)
  local c1 = rounded(ps)
  grow(ps, -c1)
  local c2 = rounded(ps)
  grow(ps, -c2)
  for k = 1, #ps do if ps[k] ~= 0 then return nil end end
  return c1, c2
end

-- The exact element-wise sum of `planes` (strings of canonical planes, the first the rounded sum),
-- plus each of `adds`, minus each of `subs` (vectors), in canonical planes: a table of K >= 2 strings.
local function exact_general(planes, adds, subs, width)
  local rows, k = {}, 2
  local pos, base, blocks = 1, 0, 0
  while base < width do
    local len = math.min(CHUNK, width - base)
    local fmt = fmt_of(len)
    blocks = blocks + 1
    local ins, outs, out = {}, {}, {}
    for i = 1, #planes do ins[i] = {sunpack(fmt, planes[i], pos)} end
    local ad, sb = {}, {}
    for i = 1, #adds do ad[i] = {sunpack(fmt, adds[i], pos)} end
    for i = 1, #subs do sb[i] = {sunpack(fmt, subs[i], pos)} end
    for j = 1, len do
      local ps = {}
      for i = #ins, 1, -1 do local v = ins[i][j] if v ~= 0 then ps[#ps + 1] = v end end
      for i = 1, #sb do grow(ps, -sb[i][j]) end
      for i = 1, #ad do grow(ps, ad[i][j]) end
      local comps = {}
      while true do
        local c = rounded(ps)
        if c == 0 then break end
        comps[#comps + 1] = c
        grow(ps, -c)
      end
      if #comps > k then k = #comps end
      out[j] = comps
    end
    rows[blocks] = {len = len, out = out}
    base, pos = base + len, pos + len * 8
  end
  local result = {}
  for r = 1, k do
    local pieces = {}
    for b = 1, blocks do
      local row, vals = rows[b], {}
      for j = 1, row.len do vals[j] = (row.out[j][r] or 0.0) + 0.0 end
      pieces[b] = spack(fmt_of(row.len), unpack(vals, 1, row.len))
    end
    result[r] = join(pieces)
  end
  return result
end

return {grow = grow, rounded = rounded, three_planes = three_planes, general = exact_general}
