"""Writes the development page's package layout from the package itself: every module and folder of
``redisync/`` with the first sentence of its docstring (a folder's: its ``__init__.py``'s; a Lua file's:
its first comment), so the page cannot drift from the code.

    python scripts/package_layout.py --write   # rewrite the block in docs/development.md
    python scripts/package_layout.py --check   # exit 1 if the page's block is not this output
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "redisync"
PAGE = ROOT / "docs" / "development.md"
BEGIN, END = "<!-- BEGIN GENERATED layout: scripts/package_layout.py -->", "<!-- END GENERATED layout -->"
WIDTH, NAME, LONGEST = 120, 22, 180  # the line's width; the name column's; the longest summary kept whole


def first_sentence(text: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split())
    match = re.match(r"(.+?[.])(\s|$)", paragraph)
    sentence = (match.group(1) if match else paragraph).rstrip(".:")
    return sentence if len(sentence) <= LONGEST else sentence[: sentence.rindex(" ", 0, LONGEST)] + " …"


def python_summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return first_sentence(doc) if doc else ""


def lua_summary(path: Path) -> str:
    comment = []
    for line in path.read_text().splitlines():
        if not line.startswith("--"):
            break
        comment.append(line.lstrip("- ").strip())
    text = " ".join(comment)
    text = re.sub(rf"^{re.escape(path.name)}:\s*", "", text)
    return first_sentence(text) if text else ""


def entry(depth: int, name: str, summary: str) -> list[str]:
    indent = "  " * depth
    head = f"{indent}{name}".ljust(NAME + 2 * depth) + " "
    if not summary:
        return [head.rstrip()]
    lines = textwrap.wrap(summary, WIDTH - len(head)) or [""]
    return [head + lines[0]] + [" " * len(head) + line for line in lines[1:]]


def folder(path: Path, depth: int) -> list[str]:
    out: list[str] = []
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".py", ".lua"))
    for p in files:
        if p.name == "__init__.py" and depth > 1:
            continue  # (a folder's docstring stands on the folder's line)
        out += entry(depth, p.name, python_summary(p) if p.suffix == ".py" else lua_summary(p))
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        if not any(sub.rglob("*.py")) and not any(sub.rglob("*.lua")):
            continue
        init = sub / "__init__.py"
        out += entry(depth, sub.name + "/", python_summary(init) if init.is_file() else "")
        out += folder(sub, depth + 1)
    return out


def layout() -> str:
    """The block: a fenced listing of the package, each name with its docstring's first sentence."""
    lines = ["redisync/", *folder(PACKAGE, 1)]
    label = "<!-- output: scripts/package_layout.py's listing of the package, which tests/test_layout.py holds to the code -->"
    return "\n".join([BEGIN, label, "```", *lines, "```", END])


def main() -> int:
    page = PAGE.read_text()
    start, stop = page.index(BEGIN), page.index(END) + len(END)
    new = page[:start] + layout() + page[stop:]
    if "--write" in sys.argv:
        PAGE.write_text(new)
        return 0
    if new != page:
        print(f"{PAGE.relative_to(ROOT)}: the package layout is not the package's; run {Path(__file__).name} --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
