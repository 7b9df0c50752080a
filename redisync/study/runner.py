"""One runner for a plan's stages: each stage's runs, kept as they finish, and the plan's summary after each.

A plan (`redisync.study.fourth_study`: its pilots, its gate, its contrast) is data — the stages'
arms and seeds, and the function that summarises the runs — and `run_stages` runs it: every run is
written to ``saved`` as it finishes (the same call again resumes where a stopped one left off, by
`redisync.study.study.run_cells`), and the summary of the runs so far is rewritten after each stage,
so a reader sees what has run even when the plan has not finished.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fleet import StudyConfig


@dataclass(frozen=True)
class Stage:
    """One batch of a plan's runs, started together: what it is (said when it starts), its cells, each
    (condition, arm, seeds), and its progress bar's name (default: the label)."""

    label: str
    cells: Sequence[tuple[str, str, Sequence[int]]]
    desc: str = ""


def run_stages(
    config: StudyConfig,
    env: str,
    stages: Sequence[Stage],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    *,
    saved: Path,
    summary_path: Path,
    workers: int,
    show_progress: bool = False,
    on_stage: Callable[[str], None] | None = None,
    stop: Callable[[dict[str, Any]], str | None] | None = None,
) -> dict[str, Any]:
    """Run ``stages`` in order on ``env`` with ``config``; after each, ``summarize`` the runs so far into
    ``summary_path``. ``stop`` may end the plan after a stage: it returns why (said through
    ``on_stage``), or None to go on. Returns the last summary."""
    from .study import run_cells

    say = on_stage or (lambda _: None)
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for stage in stages:
        say(stage.label)
        runs += run_cells(
            config, [(c, arm, list(seeds)) for c, arm, seeds in stage.cells], url=None, env_spec=env,
            workers=workers, show_progress=show_progress, desc=stage.desc or stage.label, saved=saved,
        )  # fmt: skip
        summary = summarize(runs)
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1, default=float))
        why = stop(summary) if stop is not None else None
        if why is not None:
            say(why)
            break
    return summary
