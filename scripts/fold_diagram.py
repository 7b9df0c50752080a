#!/usr/bin/env python
"""Draws docs/concepts/fold.png: one fold of a merge key, from a collector's report to every
collector's view (the semantics page's picture). Run it again after changing the fold's steps.

    .venv/bin/python scripts/fold_diagram.py [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "docs" / "concepts" / "fold.png"

# (x, y, title, lines): the boxes, left to right along the fold, then the pull below
BOXES = [
    (0.00, 0.55, "1. report", ["shard 2, incarnation, seq 41", "its own cumulative", "count, sum (, sumsq)"]),
    (0.255, 0.55, "2. checks, all first", ["epoch and schema digest", "incarnation and seq", "shape, finite, size"]),
    (0.51, 0.55, "3. slot replaced", ["slot:2 := the report", "(a retry or duplicate:", "the same slot again)"]),
    (0.765, 0.55, "4. aggregate", ["Σ of the live slots", "(lapsed state slots", "leave, once)"]),
    (0.765, 0.08, "5. announced", ["fleet version + 1", "on the run's channel", "(once per window)"]),
    (
        0.34,
        0.08,
        "6. pulled at a reset boundary",
        ["every collector, one round trip:", "view = aggregate − own slot as folded", "+ own now"],
    ),
]
ARROWS = [((0.232, 0.68), (0.255, 0.68)), ((0.487, 0.68), (0.51, 0.68)), ((0.742, 0.68), (0.765, 0.68)),
          ((0.877, 0.54), (0.877, 0.37)), ((0.765, 0.21), (0.726, 0.21))]  # fmt: skip


def draw(out: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4.2))
    ax.set_xlim(-0.02, 1.0)
    ax.set_ylim(0, 1)
    ax.axis("off")
    for x, y, title, lines in BOXES:
        width = 0.375 if title.startswith("6.") else 0.222
        ax.add_patch(FancyBboxPatch((x, y), width, 0.27, boxstyle="round,pad=0.01", fc="#eef1fb", ec="#3949ab"))
        ax.text(x + 0.01, y + 0.22, title, fontsize=11, weight="bold", va="center")
        for i, line in enumerate(lines):
            ax.text(x + 0.01, y + 0.15 - 0.055 * i, line, fontsize=8.5, va="center")
    for start, end in ARROWS:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=16, color="#3949ab"))
    ax.text(0.02, 0.95, "One fold of a merge key, inside Redis (one function call, all or nothing)", fontsize=12)
    ax.text(0.02, 0.36, "a refused report: nothing changes;\nit goes to the dead letters with its reason",
            fontsize=9, color="#b71c1c")  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
