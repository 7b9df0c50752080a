"""Writes the generated stretches of the fold's Lua: in ``redisync/store/lua/semantics/merge.lua`` the
constants it shares with ``redisync/store/semantics/merge.py`` (SUB, SUBS, LAYOUT: Python is their one
source) and the unrolled ``fold_values``, in ``redisync/store/lua/shared.lua`` the unrolled ``join64``.

The fused pass holds BLOCK (32) values of every input in local variables, so its Lua is written out
in full rather than looped; this script is where that text comes from. In its file each stretch
stands between ``-- BEGIN GENERATED <name>`` and ``-- END GENERATED <name>`` markers.

    python scripts/generate_fold_pass.py --write   # rewrite the stretches in place
    python scripts/generate_fold_pass.py --check   # fail when a stretch differs (run by the tests)

Why the block is 32 values wide and not wider: Lua 5.1 allows at most 200 local variables in one
function, and ``fold_values`` holds five blocks of them at once (p, c, r, a, b: 5 × 32 = 160, plus its
own). A block of 36 (180 + 26 others) no longer compiles ("too many local variables").
"""

import re
import sys
from pathlib import Path

from redisync.store.semantics.merge import LAYOUT, SUB, SUBS

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
w("""local function fold_values(name, payload, width, cs, size, sumsq, tree)
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

ops = " ..\n".join(
    "    " + " .. ".join(f"(t[i + {k}] or '')" for k in range(j, min(j + 5, 64))) for j in range(0, 64, 5)
).replace("(t[i + 0] or '')", "(t[i] or '')")
SECTIONS = {
    "constants": f"local SUB, SUBS = {SUB}, {SUBS}\nlocal LAYOUT = '{LAYOUT}'",
    "join64": "local function join64(t, i)\n  return\n" + ops + "\nend",
    "fold_values": "\n".join(out),
}
LUA = Path(__file__).resolve().parents[1] / "redisync/store/lua"
FILES = {"constants": "semantics/merge.lua", "join64": "shared.lua", "fold_values": "semantics/merge.lua"}
MARK = "-- {} GENERATED {}"
NOTE = "-- (written by scripts/generate_fold_pass.py --write: edit the generator, not these lines)"


def stretch(text: str, name: str) -> tuple[int, int]:
    """Where the generated lines of ``name`` start and end in ``text`` (between its markers)."""
    begin, end = MARK.format("BEGIN", name), MARK.format("END", name)
    if text.count(begin) != 1 or text.count(end) != 1:
        sys.exit(f"{FILES[name]} must hold exactly one {begin!r} and one {end!r} line")
    start = text.index("\n", text.index(begin)) + 1
    start = text.index("\n", start) + 1  # past the note
    return start, text.index(end)


def written(text: str, names: list[str]) -> str:
    """``text`` with each generated stretch of ``names`` replaced by what this script writes."""
    for name in names:
        start, end = stretch(text, name)
        text = text[:start] + SECTIONS[name] + "\n" + text[end:]
    return text


if __name__ == "__main__":
    texts = {path: (LUA / path).read_text() for path in set(FILES.values())}
    if "--check" in sys.argv:
        stale = [
            name
            for name, section in SECTIONS.items()
            if texts[FILES[name]][slice(*stretch(texts[FILES[name]], name))] != section + "\n"
        ]
        sys.exit(
            f"the generated {' and '.join(stale)} differ from scripts/generate_fold_pass.py's: run it with --write"
            if stale
            else 0
        )
    if "--write" in sys.argv:
        for path, text in texts.items():
            (LUA / path).write_text(written(text, [name for name, file in FILES.items() if file == path]))
    else:
        print("\n".join(SECTIONS.values()))
