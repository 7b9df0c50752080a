#!/usr/bin/env python
"""Draws the study page's figure from the committed results (records/ab/second-follow-up/results.json):
for each contrast of the second follow-up, the mean paired difference in completion AUC with its 95 %
t-interval, grouped by the question it answers. Writes docs/ab/answers.png.

    .venv/bin/python scripts/study_figures.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "records" / "ab" / "second-follow-up" / "results.json"
OUT = ROOT / "docs" / "ab" / "answers.png"
QUESTIONS = {
    "A": "A: unsynced 64-env shards, the paper's mix",
    "B": "B: one owner's state, or the weighted merge, vs the pooled sum",
    "C": "C: unsynced shards by envs per shard (code mix)",
}


def label(contrast: str) -> str:
    """A contrast's row label: its condition and arms in words."""
    condition, _, arms = contrast.partition(": ")
    shards = {"16-shards": "16 × 64 envs", "8-shards": "8 × 128 envs"}
    size = next((v for k, v in shards.items() if k in arms), "4 × 256 envs")
    first = arms.split(" − ")[0].split("-")[0]
    where = "identical shards" if condition == "H" else "shards of different profiles"
    return f"{first} − pooled, {size}, {where}"


def draw(out: Path) -> list[dict]:
    rows = json.loads(RESULTS.read_text())["second_follow_up"]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.6))
    y, ticks, names = 0, [], []
    for question, title in QUESTIONS.items():
        ax.text(-0.49, y - 0.35, title, fontsize=9, weight="bold", ha="left", va="center")
        for row in (r for r in rows if r["question"] == question):
            y -= 1
            color = "#b71c1c" if row["hi"] < 0 else "#616161"
            ax.errorbar(row["mean"], y, xerr=[[row["mean"] - row["lo"]], [row["hi"] - row["mean"]]], fmt="o",
                        color=color, capsize=3)  # fmt: skip
            ticks.append(y)
            names.append(label(row["contrast"]))
        y -= 1.2
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_xlim(-0.5, 0.2)
    ax.set_ylim(y + 0.6, 0.2)
    ax.set_xlabel("completion AUC difference (mean, 95 % t-interval, 10 seeds; below 0: worse than pooled)", fontsize=9)
    ax.set_title("The 2-D toy task's second follow-up: what syncing changed", fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return rows


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
