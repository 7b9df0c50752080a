"""Writes the unrolled parts of ``redisync/store/lua/fold.lua``: ``join`` and the fused pass.

The fused pass holds BLOCK (32) values of every input in local variables, so its Lua is written out
in full rather than looped; this script is where that text comes from. ``--check`` (run by the
tests) fails when fold.lua's copy differs from what this writes; without it, prints both sections.
Edit here, then paste the output over the sections in fold.lua.
"""

import re

B = 32


def names(p):
    return ", ".join(f"{p}{i}" for i in range(1, B + 1))


def zeros():
    return ", ".join("0.0" for _ in range(B))


def add(a, b):
    return ", ".join(f"{a}{i} + {b}{i}" for i in range(1, B + 1))


def sq(c):
    return " + ".join(f"{c}{i} * {c}{i}" for i in range(1, B + 1))


def wrap(s, indent, width=116):
    """Break only after ', ' or before ' + ' (never inside a term)."""
    tokens = re.split(r"(?<=, )", s) if ", " in s else re.split(r"(?= \+ )", s)
    lines, cur = [], indent
    for t in tokens:
        if len(cur) + len(t.rstrip()) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = indent + "  " + t.lstrip()
        else:
            cur += t
    lines.append(cur.rstrip())
    return "\n".join(lines)


def each(target, source, ind):
    """``target_i = source_i`` for every i, one statement each: Lua compiles a statement into one
    instruction, where a multiple assignment goes through temporaries (two)."""
    stmts = [f"{target}{i} = {source.format(i=i)}" for i in range(1, B + 1)]
    lines, cur = [], ind
    for st in stmts:
        if len(cur) + len(st) + 1 > 116 and cur.strip():
            lines.append(cur.rstrip())
            cur = ind
        cur += st + " "
    lines.append(cur.rstrip())
    return "\n".join(lines)


def assign(lhs, rhs, ind, local=False):
    head = ("local " if local else "") + lhs + " ="
    return wrap(head, ind) + "\n" + wrap(rhs, ind + "  ")


out = []
w = out.append
w("""-- The fused pass over one merge key's values ---------------------------------------------------------
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

-- One string of many pieces. Redis' Lua hashes every byte of every string it makes, so a string
-- costs its length each time one is made: table.concat makes each byte several times over (its
-- buffer merges pieces in steps), one `..` of many operands makes it once.
local function join64(t, i)
  return
__JOIN__
end
local function join(t)
  local n = #t
  if n <= 1 then return t[1] or '' end
  if n == 2 then return t[1] .. t[2] end
  if n == 3 then return t[1] .. t[2] .. t[3] end
  local out = {}
  for i = 1, #t, 64 do out[#out + 1] = join64(t, i) end
  return join(out)
end

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

-- tree: the aggregate's terms in order, each {stored = a vector} or a group re-made from its parts
-- {parts = {...}, out = {}}, each part {stored = a vector} or a sub-group re-made from its slots
-- {members = {slot string, or true for the payload}, out = {}}; a re-made sum's blocks go to its out,
-- and the sum itself to its field sum. Returns the aggregate, or (nil, rejection, whether it is the
-- aggregate's).
-- (0 + x is x for every sum made here, which starts at +0: a lone part is its group's sum, a lone
-- group the aggregate.)
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
  if head > 0 then
    local why, of_agg = fold_head(st, payload, tree, single, head)
    if why then return nil, why, of_agg end
  end
  local pos, base, blk = head * 8 + 1, head, head > 0 and 1 or 0
  while base < width do
    blk = blk + 1""")
IND = "    "
w(assign(names("p"), "sunpack(FB, payload, pos)", IND, True))
w(assign(names("c"), zeros(), IND, True))
w(IND + "for ti = 1, nterms do")
w(IND + "  local term = tree[ti]")
w(IND + "  local parts = term.parts")
w(IND + "  if parts then")
J = IND + "    "
w(assign(names("r"), zeros(), J, True))
w(J + "local packed")
w(J + "for pi = 1, #parts do")
w(J + "  local part = parts[pi]")
w(J + "  local members = part.members")
w(J + "  if members then")
K = J + "    "
w(assign(names("a"), zeros(), K, True))
w(K + "for mi = 1, #members do")
w(K + "  local s = members[mi]")
w(K + "  if s == true then")
w(each("a", "a{i} + p{i}", K + "    "))
w(K + "  else")
w(assign(names("b"), "sunpack(FB, s, pos)", K + "    ", True))
w(each("a", "a{i} + b{i}", K + "    "))
w(K + "  end")
w(K + "end")
w(assign("packed", f"spack(FB, {names('a')})", K))
w(K + "part.out[blk] = packed")
w(K + "if term.lone then")
w(each("r", "a{i}", K + "  "))
w(K + "else")
w(each("r", "r{i} + a{i}", K + "  "))
w(K + "end")
w(J + "  else")
w(assign(names("b"), "sunpack(FB, part.stored, pos)", K, True))
w(each("r", "r{i} + b{i}", K))
w(J + "  end")
w(J + "end")
w(J + "if not term.lone then")
w(assign("packed", f"spack(FB, {names('r')})", J + "  "))
w(J + "end")
w(J + "term.out[blk] = packed")
w(J + "if single then")
w(each("c", "r{i}", J + "  "))
w(J + "  aggs[blk] = packed")
w(J + "else")
w(each("c", "c{i} + r{i}", J + "  "))
w(J + "end")
w(IND + "  else")
w(assign(names("b"), "sunpack(FB, term.stored, pos)", J, True))
w(each("c", "c{i} + b{i}", J))
w(IND + "  end")
w(IND + "end")
w(IND + "if not single then")
w(assign("aggs[blk]", f"spack(FB, {names('c')})", IND + "  "))
w(IND + "end")
w(IND + "-- the cheap look: finite squares mean finite values and, with counts of 0 or >= 1, finite moments")
w(assign("sq", sq("c"), IND, True))
w("""    local slow = sq - sq ~= 0
    if not slow then
      if base < cs then -- count values: never negative; a fraction makes the moments' cheap look unsound""")
w(IND + "    if base + BLOCK > cs then -- counts, then sums: the counts alone element by element")
w(IND + "      if cs == 1 then -- one count, the first value (its problem: the checks element by element name it)")
w(IND + "        slow = p1 - p1 ~= 0 or p1 < 0 or c1 - c1 ~= 0")
w(IND + "        if not slow then")
w(IND + "          counts[1] = c1")
w(IND + "          if c1 > 0 and c1 < 1 then st.ok = false end")
w(IND + "        end")
w(IND + "      else")
w(wrap(f"local why, of_agg = check(st, base, cs - base, {{{names('p')}}}, {{{names('c')}}})", IND + "        "))
w(IND + "        if why then return nil, why, of_agg end")
w(IND + "      end")
w(wrap(f"slow = slow or not st.ok or base + BLOCK > cs + size and mmin({names('p')}) < 0", IND + "      "))
w(wrap(f"elseif mmin({names('p')}) < 0 then", IND + "    "))
w(IND + "      slow = true")
w(wrap(f"elseif mmin({names('c')}) < 1 then", IND + "    "))
w(wrap(f"for _, n in ipairs({{{names('c')}}}) do", IND + "      "))
w(IND + "        if n > 0 and n < 1 then st.ok = false end")
w(IND + "      end")
w(IND + "    end")
w(IND + "  elseif not st.ok then")
w(IND + "    slow = true -- counts that are fractions")
w(wrap(f"elseif base + BLOCK > cs + size and mmin({names('p')}) < 0 then", IND + "  "))
w(IND + "    slow = true -- sumsq values that may be negative")
w(IND + "  end")
w(IND + "end")
w(IND + "if slow then")
w(wrap(f"local why, of_agg = check(st, base, BLOCK, {{{names('p')}}}, {{{names('c')}}})", IND + "  "))
w(IND + "  if why then return nil, why, of_agg end")
w(IND + "end")
w(IND + "base, pos = base + BLOCK, pos + BLOCK * 8")
w("  end")
w("""  local made = {}
  for ti = 1, nterms do
    local term = tree[ti]
    local parts = term.parts
    if parts then
      for pi = 1, #parts do if parts[pi].members then parts[pi].sum = once(made, parts[pi].out, join) end end
      term.sum = once(made, term.out, join) -- (a sum's string made once, however many share its blocks)
    end
  end
  return once(made, aggs, join)
end""")
ops = " ..\n".join(
    "    " + " .. ".join(f"(t[i + {k}] or '')" for k in range(j, min(j + 5, 64))) for j in range(0, 64, 5)
).replace("(t[i + 0] or '')", "(t[i] or '')")
text = "\n".join(out).replace("__JOIN__", ops)
start = text.index("-- One string of many pieces.")
end = text.index("  return join(out)\nend\n") + len("  return join(out)\nend\n")
SECTIONS = {"join": text[start:end], "fused pass": (text[:start] + text[end:]).strip() + "\n"}

if __name__ == "__main__":
    import sys
    from pathlib import Path

    fold = (Path(__file__).resolve().parents[1] / "redisync/store/lua/fold.lua").read_text()
    if "--check" in sys.argv:
        stale = [name for name, section in SECTIONS.items() if section not in fold]
        sys.exit(f"fold.lua's {' and '.join(stale)} differ from scripts/generate_fold_pass.py's" if stale else 0)
    print("\n".join(SECTIONS.values()))
