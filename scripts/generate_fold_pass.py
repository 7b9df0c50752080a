"""Writes the generated stretches of the fold's Lua: in ``redisync/store/lua/semantics/merge.lua`` the
constants it shares with ``redisync/store/semantics/merge.py`` (LIMIT, LAYOUT: Python is their one
source) and the unrolled ``exact_blocks``, in ``redisync/store/lua/shared.lua`` the unrolled ``join64``.

The exact pass holds BLOCK (32) values of every input in local variables, so its Lua is written out
in full rather than looped; this script is where that text comes from. In its file each stretch
stands between ``-- BEGIN GENERATED <name>`` and ``-- END GENERATED <name>`` markers.

    python scripts/generate_fold_pass.py --write   # rewrite the stretches in place
    python scripts/generate_fold_pass.py --check   # fail when a stretch differs (run by the tests)

Why the block is 32 values wide: Lua 5.1 allows at most 200 local variables in one function, and
``exact_blocks`` holds four blocks of them at once (the payload, the sum's two planes, the slot it
replaces: 4 × 32 = 128, plus its own).
"""

import math
import re
import sys
from pathlib import Path

from redisync.store.semantics.merge import LAYOUT, LIMIT

B = 32


def names(p):
    return ", ".join(f"{p}{i}" for i in range(1, B + 1))


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


def assign(lhs, rhs, ind, local=False):
    head = ("local " if local else "") + lhs + " ="
    return wrap(head, ind) + "\n" + wrap(rhs, ind + "  ")


out = []
w = out.append
w("""local function exact_blocks(st, payload, hi, lo, sub, pos, base, blk, his, los)
  local width, cs, size, name = st.width, st.cs, st.size, st.name
  local s, bv, e, t, f, d, dd
  local look, scanned, sumsq = true, false, st.sumsq
  while base < width do
    blk = blk + 1""")
IND = "    "
w(assign(names("p"), "sunpack(FB, payload, pos)", IND, True))
w(assign("sq", sq("p"), IND, True))
w(IND + "-- a value past 2^511 in magnitude, a block of counts, a negative value in a sumsq block: the payload")
w(IND + "-- checked element by element, in order (once)")
w(
    wrap(
        f"if not scanned and (sq - sq ~= 0 or base < cs or base + BLOCK > cs + size and mmin({names('p')}) < 0) then",
        IND,
    )
)
w(IND + "  local why = payload_problem(name, payload, width, cs, size)")
w(IND + "  if why then return nil, why end")
w(IND + "  scanned = true")
w(IND + "end")
w(assign(names("h"), "sunpack(FB, hi, pos)", IND, True))
w(assign(names("l"), "sunpack(FB, lo, pos)", IND, True))
w(IND + "-- each element's planes canonical: the first is the rounded sum of both")
w(wrap("if " + " or ".join(f"h{i} + l{i} ~= h{i}" for i in range(1, B + 1)) + " then", IND))
w(IND + "  return nil, {'corrupt_state', name, 'stored agg and agg_lo are not an exact sum\\'s planes'}")
w(IND + "end")


def update(i, v, minus, ind):
    """(h_i, l_i) - v or + v exactly: a two-sum (or two-difference) into the first plane, its error
    two-summed into the second, then the two planes made canonical; where that second sum has an
    error of its own (a rest already using its 53 bits, carried), the three pieces are made into two
    canonical planes by ``three_planes`` (nil, and so the general path, only when the sum needs a
    third plane)."""
    first = (
        f"s = h{i} - {v} bv = h{i} - s e = (h{i} - (s + bv)) + (bv - {v})"
        if minus
        else f"s = h{i} + {v} bv = s - h{i} e = (h{i} - (s - bv)) + ({v} - bv)"
    )
    return "\n".join(
        [
            ind + first,
            ind + f"t = l{i} + e bv = t - l{i} f = (l{i} - (t - bv)) + (e - bv)",
            ind + "if f ~= 0 then",
            ind + f"  h{i}, l{i} = three_planes(s, t, f)",
            ind + f"  if not h{i} then return nil, 'general' end",
            ind + "else",
            ind + f"  h{i} = s + t bv = h{i} - s l{i} = (s - (h{i} - bv)) + (t - bv)",
            ind + "end",
        ]
    )


w(IND + "if sub then")
w(IND + "  -- the payload in and the slot it replaces out: their difference, when it is one float (a")
w(IND + "  -- cumulative statistic moves by less than half: always), else the slot out, then the payload in")
w(assign(names("o"), "sunpack(FB, sub, pos)", IND + "  ", True))
for i in range(1, B + 1):
    w(IND + f"  d = p{i} - o{i} bv = p{i} - d dd = (p{i} - (d + bv)) + (bv - o{i})")
    w(IND + "  if dd == 0 then")
    w(update(i, "d", False, IND + "    "))
    w(IND + "  else")
    w(update(i, f"o{i}", True, IND + "    "))
    w(update(i, f"p{i}", False, IND + "    "))
    w(IND + "  end")
w(IND + "else -- a shard's first slot: the payload in")
for i in range(1, B + 1):
    w(update(i, f"p{i}", False, IND + "  "))
w(IND + "end")
w(assign("his[blk]", f"spack(FB, {names('h')})", IND))
w(assign("los[blk]", f"spack(FB, {names('l')})", IND))
w(IND + "-- the moments' cheap look: with counts of 0 or >= 1 a mean is finite, and its square (with sums of")
w(IND + "-- squares) too when the sums are below 2^511")
w(IND + "if sumsq and base + BLOCK > cs and base < cs + size then")
w(assign("sq", sq("h"), IND + "  "))
w(IND + "  if sq - sq ~= 0 then look = false end")
w(IND + "end")
w(wrap(f"if base < cs and mmin({names('h')}) < 1 then", IND))
w(wrap(f"  for _, n in ipairs({{{names('h')}}}) do", IND))
w(IND + "    if n > 0 and n < 1 then look = false end")
w(IND + "  end")
w(IND + "end")
w(IND + "base, pos = base + BLOCK, pos + BLOCK * 8")
w("  end")
w("  return look")
w("end")


ops = " ..\n".join(
    "    " + " .. ".join(f"(t[i + {k}] or '')" for k in range(j, min(j + 5, 64))) for j in range(0, 64, 5)
).replace("(t[i + 0] or '')", "(t[i] or '')")
SECTIONS = {
    "constants": f"local LIMIT = 2 ^ {int(math.log2(LIMIT))}\nlocal LAYOUT = '{LAYOUT}'",
    "join64": "local function join64(t, i)\n  return\n" + ops + "\nend",
    "exact_blocks": "\n".join(out),
}
LUA = Path(__file__).resolve().parents[1] / "redisync/store/lua"
FILES = {"constants": "semantics/merge.lua", "join64": "shared.lua", "exact_blocks": "semantics/merge.lua"}
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
