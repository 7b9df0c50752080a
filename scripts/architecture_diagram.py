#!/usr/bin/env python
"""Draws docs/architecture.png: the processes of a synced fleet (left) and the package floor by floor
(right), for the development page. The floors are read from pyproject.toml's import contract and each
floor's modules from the package itself, so the picture follows the code: run it again after moving
files.

    .venv/bin/python scripts/architecture_diagram.py [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib
import tomllib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "architecture.png"
INK, FILL, QUIET = "#3949ab", "#eef1fb", "#5c6bc0"

# (x, y, width, height, title, lines): the processes at run time, and where the network is
PROCESSES = [
    (0.00, 0.70, 0.47, 0.26, "a collector process", ["env loop → terms", "   (sampler, normaliser, curriculum)",
                                                      "Syncer: on_step(), at_reset_boundary():", "   no network, no lock, no system call"]),
    (0.00, 0.36, 0.47, 0.22, "its sidecar process", ["collector/sidecar_process.py: a Relay", "for the thread worker's network loop:",
                                                      "publish · pull · lease · listen"]),
    (0.57, 0.36, 0.43, 0.60, "Redis", ["one Functions library (store/lua):", "fold: check every key,", "   then apply all",
                                       "   (each semantics' Lua module)", "pull · register · claim", "lease · restore · announce",
                                       "", "a run's keys, hash-tagged", "by its name; its versions", "channel"]),
    (0.00, 0.02, 0.47, 0.22, "the learner and operators", ["FleetMonitor (learner.py)", "inspect · watch · exporter",
                                                            "   (inspection.py: reads only)"]),
]  # fmt: skip
LINKS = [
    ((0.22, 0.70), (0.22, 0.58), "mailbox + shared memory"),
    ((0.47, 0.52), (0.57, 0.52), "FCALL"),
    ((0.57, 0.42), (0.47, 0.42), "announced"),
    ((0.47, 0.13), (0.57, 0.40), "reads"),
]


def floors() -> list[list[str]]:
    """The import contract's layers, top floor first (pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layers = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")["layers"]
    return [[name.strip().removeprefix("redisync.") for name in layer.split("|")] for layer in layers]


def modules_of(name: str) -> str:
    """A package's modules (a module's own name): what the floor holds, from the files."""
    path = ROOT / "redisync" / name
    if not path.is_dir():
        return f"{name}.py"
    inside = sorted(
        p.stem if p.is_file() else p.name + "/"
        for p in path.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    )
    return f"{name}/: " + ", ".join(inside) if inside else f"{name}/"


def draw(out: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(17, 7.5), gridspec_kw={"width_ratios": [1, 1.2]})
    for ax in (left, right):
        ax.set_xlim(-0.02, 1.02)
        ax.set_ylim(-0.02, 1.04)
        ax.axis("off")
    left.set_title("At run time: who talks to whom", loc="left", fontsize=12)
    for x, y, w, h, title, lines in PROCESSES:
        left.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01", fc=FILL, ec=INK))
        left.text(x + 0.015, y + h - 0.04, title, fontsize=10, weight="bold", va="center")
        for i, line in enumerate(lines):
            left.text(x + 0.015, y + h - 0.085 - 0.045 * i, line, fontsize=8.5, va="center")
    for start, end, label in LINKS:
        left.add_patch(FancyArrowPatch(start, end, arrowstyle="<|-|>" if label.startswith("mail") else "-|>",
                                       mutation_scale=14, color=INK))  # fmt: skip
        left.text(min(start[0], end[0]) + 0.005, (start[1] + end[1]) / 2 + 0.015, label, fontsize=8, color=QUIET)
    right.set_title("The package, floor by floor (imports only point down)", loc="left", fontsize=12)
    layers = floors()
    height = 1.0 / len(layers)
    for k, layer in enumerate(layers):
        y = 1.0 - (k + 1) * height
        right.add_patch(FancyBboxPatch((0, y + 0.01), 1.0, height - 0.025, boxstyle="round,pad=0.005", fc=FILL, ec=INK))
        text = "   ".join(modules_of(name) for name in layer)
        words, lines, line = text.split(" "), [], ""
        for word in words:  # wrapped by hand: matplotlib does not wrap inside a box
            if len(line) + len(word) > 112:
                lines.append(line)
                line = ""
            line += word + " "
        lines.append(line)
        for i, part in enumerate(lines[:3]):
            right.text(0.012, y + height - 0.035 - 0.03 * i, part.rstrip(), fontsize=7.5, va="center")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
