"""One runner for a plan's stages: each stage's runs, kept as they finish, and the plan's summary after each.

A plan (`redisync.study.plans.walker_contrast`: its pilots, its gate, its contrast; `redisync.study.plans.walker_ema_window`:
its gate, then its arms at two EMA rates) is data — the stages' arms, seeds and configurations, and
the function that summarises the runs — and `run_stages` runs it: every run is written to ``saved``
as it finishes (the same call again resumes where a stopped one left off, by
`redisync.study.study.run_cells`), and the summary of the runs so far is rewritten after each stage,
so a reader sees what has run even when the plan has not finished. With ``load_only`` it trains
nothing: the summary is made from the runs kept so far (a report of a study still going).
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
    config: StudyConfig | None = None
    """The stage's own configuration (None: the plan's)."""
    folder: str = ""
    """Where its runs are kept, under the plan's ``saved`` folder ("": in it)."""
    tag: Callable[[dict[str, Any]], None] | None = None
    """Marks each of its runs (in memory, for the summary: which stage a run belongs to)."""


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
    load_only: bool = False,
) -> dict[str, Any]:
    """Run ``stages`` in order on ``env`` with ``config`` (or a stage's own); after each, ``summarize``
    the runs so far into ``summary_path``. ``stop`` may end the plan after a stage: it returns why
    (said through ``on_stage``), or None to go on. ``load_only``: train nothing, take the runs kept.
    Returns the last summary."""
    from .study import run_cells

    say = on_stage or (lambda _: None)
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for stage in stages:
        say(stage.label)
        cfg, folder = stage.config or config, saved / stage.folder if stage.folder else saved
        cells = [(c, arm, list(seeds)) for c, arm, seeds in stage.cells]
        got = _kept(cfg, cells, folder) if load_only else run_cells(
            cfg, cells, url=None, env_spec=env, workers=workers, show_progress=show_progress,
            desc=stage.desc or stage.label, saved=folder,
        )  # fmt: skip
        if stage.tag is not None:
            for run in got:
                stage.tag(run)
        runs += got
        summary = summarize(runs)
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        summary_path.write_text(json.dumps(summary, indent=1, default=float))
        why = stop(summary) if stop is not None else None
        if why is not None:
            say(why)
            break
    return summary


def _kept(cfg: StudyConfig, cells: list[tuple[str, str, list[int]]], folder: Path) -> list[dict[str, Any]]:
    """The runs of ``cells`` kept in ``folder`` so far, each summarised (none is trained)."""
    from .study import condition_config, load_run, summarise_run

    found = [load_run(folder, condition_config(cfg, c), arm, seed) for c, arm, seeds in cells for seed in seeds]  # type: ignore[arg-type]
    for run in found:
        if run is not None and "summary" not in run:  # (every run saves its summary; an old file may not)
            run["summary"] = summarise_run(run)
    return [run for run in found if run is not None]
