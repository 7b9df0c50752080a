"""The study, pre-registered: the gate, the plan of arms and seeds, the contrasts, and the runner.

Fixed here, in code, before any run:

- **Primary metric**: ``completion_auc``, the area under the full-motion completion curve (the mean
  completion over the run's evaluations, in [0, 1]).
- **Gate**: on H, ``single − uniform`` over the gate's seeds must be at least `GATE` in the
  primary metric; otherwise the task cannot tell curricula apart and the study stops there (retune
  the task, never the gate).
- **Primary contrasts** (`PRIMARY`), paired by seed, exact sign-flip tests with Holm's
  correction; "no difference" only from the equivalence test against `MARGIN`.
- Everything else (`SECONDARY`, the mechanism figures) is descriptive.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import multiprocessing as mp
import os
import queue
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import RedisyncError
from ..lifeline import hold_to_parent, initializer_args
from . import provenance
from .fleet import ARMS, EnvFactory, StudyConfig, default_env, run_arm
from .stats import contrast, primary_family
from .task import Condition

PRIMARY_METRIC = "completion_auc"
GATE = 0.2
GATE_SEEDS = (100, 101, 102)  # not the study's seeds: the gate is a pilot
MARGIN = 0.1  # the equivalence margin in completion AUC
PRIMARY: tuple[tuple[str, str, str], ...] = (
    # (condition, a, b): the contrast a − b
    ("H", "single", "uniform"),  # does the curriculum matter at all (the positive control)
    ("H", "local", "pooled"),  # identical shards: does unsynced drift hurt
    ("X", "local", "pooled"),  # different shards: own state vs one pooled distribution
    ("X", "broadcast", "pooled"),  # different shards: one shard's state for all
)
SECONDARY: tuple[tuple[str, str, str], ...] = (
    ("H", "pooled", "single"),
    ("H", "broadcast", "pooled"),
    ("H", "weighted", "pooled"),
    ("H", "local-paper", "pooled-paper"),  # noise without the sharpness bias
    ("H", "local", "local-paper"),  # the sharpness bias of an unsynced shard
    ("H", "local-16-shards", "pooled-16-shards"),  # the noise dose: a quarter of the envs per shard
    ("X", "per-profile", "pooled"),
    ("X", "per-profile", "local"),
    ("X", "weighted", "pooled"),
    ("X", "norm-local", "pooled"),  # the normaliser, with a profile-specific observation offset
)
X_OBS_OFFSET = 1.0

SUMMARY_METRICS = {
    # metric: (description, higher is better)
    "completion_auc": ("PRIMARY: mean full-motion completion over the run's evaluations", True),
    "final_completion": ("full-motion completion at the last evaluation", True),
    "skill_share": ("share of the fleet's env steps spent in skill segments", True),
    "mean_drift_tv": ("TV distance of the shards' start distributions from the pooled one, run average", False),
    "mean_buffer_tv": ("TV distance of the mixture the replay buffer receives from the pooled one, run average", False),
}


def condition_config(cfg: StudyConfig, condition: Condition) -> StudyConfig:
    """The configuration of a fleet condition: X has profiles of its own and their observation offset."""
    task = replace(cfg.task, condition=condition, obs_offset=X_OBS_OFFSET if condition == "X" else 0.0)
    return replace(cfg, task=task)


def plan(primary_seeds: int, secondary_seeds: int) -> list[tuple[str, str, list[int]]]:
    """Every (condition, arm) the contrasts need, with its seeds: the primary contrasts' arms get
    ``primary_seeds``, the others ``secondary_seeds`` (the first of the same seeds, so all pair)."""
    seeds: dict[tuple[str, str], int] = {}
    for family, n in ((SECONDARY, secondary_seeds), (PRIMARY, primary_seeds)):
        for condition, a, b in family:
            for arm in (a, b):
                seeds[(condition, arm)] = max(seeds.get((condition, arm), 0), n)
    return [(c, a, list(range(n))) for (c, a), n in sorted(seeds.items())]


def load_env_factory(spec: str | None, cfg: StudyConfig) -> EnvFactory:
    """``module:function`` returning a `EnvFactory` for the study's task config, or the built-in task."""
    if not spec:
        return default_env(cfg.task)
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"--env must look like 'package.module:function', got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ValueError(f"--env {spec!r}: cannot import {module!r} ({e})") from None
    except AttributeError:
        raise ValueError(f"--env {spec!r}: module {module!r} has no {name!r}") from None
    return factory(cfg.task)


def summarise_run(run: dict[str, Any]) -> dict[str, float]:
    completion = [row["completion"] for row in run["curve"]]
    drift = [float(np.mean(d["tv"])) for d in run["drift"] if d["tv"]]
    buffer_drift = [d["buffer_tv"] for d in run["drift"] if d["buffer_tv"] is not None]
    skill = [row["skill_success"] for row in run["curve"] if "skill_success" in row]
    extra = {"skill_success_auc": float(np.mean(skill)), "final_skill_success": float(skill[-1])} if skill else {}
    return extra | {
        "completion_auc": float(np.mean(completion)),
        "final_completion": float(completion[-1]),
        "skill_share": float(run["skill_share"]),
        "mean_drift_tv": float(np.mean(drift)) if drift else 0.0,
        "mean_buffer_tv": float(np.mean(buffer_drift)) if buffer_drift else 0.0,
        # the env steps at the first evaluation that tracked the whole motion (the budget when none did)
        "steps_to_complete": float(
            next((row["env_steps"] for row in run["curve"] if row["completion"] >= 1.0), run["curve"][-1]["env_steps"])
        ),
    }


def _values(runs: list[dict[str, Any]], condition: str, arm: str, metric: str = PRIMARY_METRIC) -> dict[int, float]:
    return {r["seed"]: r["summary"][metric] for r in runs if r["condition"] == condition and r["arm"] == arm}


def paired(
    runs: list[dict[str, Any]], condition: str, a: str, b: str, metric: str = PRIMARY_METRIC
) -> tuple[list[float], list[float]]:
    """The two arms' values on the seeds both ran, in seed order."""
    va, vb = _values(runs, condition, a, metric), _values(runs, condition, b, metric)
    seeds = sorted(set(va) & set(vb))
    return [va[s] for s in seeds], [vb[s] for s in seeds]


def gate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    single, uniform = paired(runs, "H", "single", "uniform")
    diffs = [s - u for s, u in zip(single, uniform, strict=False)]
    mean = float(np.mean(diffs)) if diffs else float("nan")
    return {
        "threshold": GATE,
        "seeds": len(diffs),
        "single": single,
        "uniform": uniform,
        "differences": diffs,
        "mean_difference": mean,
        "passed": bool(diffs) and mean >= GATE,
    }


def analyse(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition and arm the mean of every metric; the primary family (Holm) and the secondary contrasts."""
    cells = sorted({(r["condition"], r["arm"]) for r in runs})
    per_arm = {
        f"{c}/{a}": {
            m: float(np.mean([r["summary"][m] for r in runs if (r["condition"], r["arm"]) == (c, a)]))
            for m in SUMMARY_METRICS
        }
        | {"seeds": sum(1 for r in runs if (r["condition"], r["arm"]) == (c, a))}
        for c, a in cells
    }

    def contrasts(family: Sequence[tuple[str, str, str]]) -> list[Any]:
        out = []
        for condition, a, b in family:
            x, y = paired(runs, condition, a, b)
            if len(x) >= 2:
                out.append(contrast(f"{condition}: {a} − {b}", x, y, MARGIN))
        return out

    primary = primary_family(contrasts(PRIMARY))
    return {
        "metric": PRIMARY_METRIC,
        "margin": MARGIN,
        "per_arm": per_arm,
        "primary": [c.to_dict() | {"verdict": c.verdict()} for c in primary],
        "secondary": [c.to_dict() | {"verdict": c.verdict()} for c in contrasts(SECONDARY)],
    }


_progress: Any = None  # a worker's queue for its env steps, given at its start


def _start_worker(parent_pid: int, pdeathsig: bool, progress: Any) -> None:
    """A study worker's start: it dies with the study's process (a killed study leaves no worker
    training on) and reports its progress on ``progress``."""
    global _progress
    hold_to_parent(parent_pid, pdeathsig)
    _progress = progress


def _worker(cfg_dict: dict[str, Any], arm: str, seed: int, url: str | None, env_spec: str | None) -> dict[str, Any]:
    cfg = seeded(StudyConfig.from_dict(cfg_dict), seed)
    origin = provenance.provenance(provenance.now())  # at the start: the code that runs, not the code at its end
    run = run_arm(cfg, arm, seed, url, load_env_factory(env_spec, cfg), on_progress=_progress.put)
    return run | {"provenance": origin}


def seeded(cfg: StudyConfig, seed: int) -> StudyConfig:
    """The run's configuration for ``seed``: its motion layout (where the skill segments lie) drawn
    from the seed too, so that seeds are different motions, not repeats of one."""
    return replace(cfg, task=replace(cfg.task, seed=seed))


def run_cells(
    cfg: StudyConfig,
    cells: Sequence[tuple[str, str, Sequence[int]]],
    *,
    url: str | None,
    env_spec: str | None,
    workers: int,
    show_progress: bool,
    desc: str,
    saved: Path | None = None,
) -> list[dict[str, Any]]:
    """Train every (condition, arm, seed) in worker processes; each run summarised. With ``saved``, a
    folder, each finished run is written there at once and a run already there is kept, not run
    again: a study stopped part way resumes where it stopped."""
    jobs = [(condition_config(cfg, cast(Condition, c)), arm, seed) for c, arm, seeds in cells for seed in seeds]
    runs: list[dict[str, Any]] = []
    if saved is not None:
        _remove_partial_runs(saved)
        kept = [load_run(saved, c, arm, seed) for c, arm, seed in jobs]
        runs = [run for run in kept if run is not None]
        jobs = [job for job, run in zip(jobs, kept, strict=True) if run is None]
    bar = _progress_bar(len(jobs) * cfg.env_steps, show_progress, desc)
    ctx = mp.get_context("spawn")  # torch and the syncers' threads do not survive a fork
    # an executor, not multiprocessing's Pool: a Pool replaces a worker that dies (one that cannot even
    # start, on a loaded machine) with another, endlessly; a broken executor fails every pending run
    progress = ctx.Queue()
    pool = ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_start_worker, initargs=(*initializer_args(), progress)
    )
    with pool:
        pending = [pool.submit(_worker, c.to_dict(), arm, seed, url, env_spec) for c, arm, seed in jobs]
        while pending:
            with contextlib.suppress(queue.Empty):
                bar.update(progress.get(timeout=0.5))
            for job in [p for p in pending if p.done()]:
                pending.remove(job)
                try:
                    run = job.result()  # a failed run raises here, with its worker's traceback
                except BrokenProcessPool as e:
                    for other in pending:
                        other.cancel()
                    raise RedisyncError(
                        f"a study worker process died before finishing its run ({e}); "
                        "nothing more is run: the runs already finished are lost with this call"
                    ) from None
                origin = run.pop("provenance")
                run["summary"] = summarise_run(run)
                if saved is not None:
                    save_run(saved, cfg_of(jobs, run), run, origin)
                runs.append(run)
                bar.set_postfix_str(
                    f"{run['condition']}/{run['arm']} seed {run['seed']}: AUC {run['summary'][PRIMARY_METRIC]:.2f}"
                )
        while not progress.empty():
            bar.update(progress.get())
    bar.close()
    runs.sort(key=lambda r: (r["condition"], r["arm"], r["seed"]))
    return runs


TMP_SUFFIX = ".partial"


def _run_path(saved: Path, condition: str, arm: str, seed: int) -> Path:
    return saved / f"{condition}-{arm}-{seed}.json"


def cfg_of(jobs: Sequence[tuple[StudyConfig, str, int]], run: dict[str, Any]) -> StudyConfig:
    """The configuration a finished run was trained with (its job's)."""
    return next(
        c for c, arm, seed in jobs if (c.task.condition, arm, seed) == (run["condition"], run["arm"], run["seed"])
    )


def save_run(saved: Path, cfg: StudyConfig, run: dict[str, Any], origin: dict[str, Any] | None = None) -> None:
    """One finished run, with the configuration it was trained with and where it came from (the
    commit, the package versions, its start time), written whole or not at all: under a temporary
    name first, renamed when complete (a study killed while writing leaves no partial run file, and
    the temporary one is removed when the study resumes)."""
    saved.mkdir(parents=True, exist_ok=True)
    origin = origin or provenance.provenance(provenance.now())
    path = _run_path(saved, run["condition"], run["arm"], run["seed"])
    tmp = path.with_name(path.name + TMP_SUFFIX)
    tmp.write_text(json.dumps({"config": cfg.to_dict(), "run": run, "provenance": origin}))
    os.replace(tmp, path)


def _remove_partial_runs(saved: Path) -> None:
    """The run files a killed study was writing (never read as runs)."""
    for tmp in saved.glob("*" + TMP_SUFFIX):
        tmp.unlink(missing_ok=True)


def _read_saved(path: Path) -> dict[str, Any]:
    """A saved run's file: its configuration and its run, or a typed error naming the file."""
    try:
        held = json.loads(path.read_text())
    except ValueError as e:
        raise RedisyncError(f"{path}: not a saved run ({e}); delete it to run it again") from None
    if not isinstance(held, dict) or not isinstance(held.get("run"), dict) or "config" not in held:
        raise RedisyncError(f"{path}: not a saved run (no config and run); delete it to run it again")
    return held


def load_run(saved: Path, cfg: StudyConfig, arm: str, seed: int) -> dict[str, Any] | None:
    """The run saved for this job, or None; one saved with another configuration is refused (two
    studies in one folder would mix)."""
    path = _run_path(saved, cfg.task.condition, arm, seed)
    if not path.is_file():
        return None
    held = _read_saved(path)
    if held.get("config") != json.loads(json.dumps(cfg.to_dict())):
        raise RedisyncError(
            f"{path} was trained with another configuration than this study's: use another --out folder, or delete "
            "the saved runs to start over"
        )
    return cast(dict[str, Any], held["run"])


def run_study(
    cfg: StudyConfig,
    *,
    primary_seeds: int = 8,
    secondary_seeds: int = 4,
    url: str | None = None,
    env_spec: str | None = None,
    workers: int = 2,
    show_progress: bool = True,
    gate_only: bool = False,
    after_gate: PlanAfterGate | None = None,
    saved: Path | None = None,
    on_stage: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """The gate, then (if it passes) the study's own plan, or the plan ``after_gate`` hands it (a toy
    plan's, as data: `redisync.study.plans.toy_dose_mechanism.after_gate`, ...); returns what
    ``results.json`` holds. With ``saved`` (a folder) every run is kept there as it finishes, and a
    call again resumes (see `run_cells`)."""
    say = on_stage or (lambda _: None)
    started = time.monotonic()
    say(f"gate: single vs uniform on H, seeds {list(GATE_SEEDS)}")
    gate_runs = run_cells(
        cfg,
        [("H", "single", GATE_SEEDS), ("H", "uniform", GATE_SEEDS)],
        url=url,
        env_spec=env_spec,
        workers=workers,
        show_progress=show_progress,
        desc="gate",
        saved=saved,
    )
    result: dict[str, Any] = {
        "config": cfg.to_dict(),
        "env": env_spec or "built-in skill tracking",
        "store": url or "embedded",
        "date": datetime.date.today().isoformat(),
        "workers": workers,
        "gate": gate(gate_runs),
        "gate_runs": gate_runs,
        "sync": f"synced in lockstep every {cfg.publish_every_steps} fleet steps (every shard publishes, then every "
        "shard takes the fleet state)",
        "runs": [],
        "analysis": None,
    }
    if gate_only or not result["gate"]["passed"]:
        result["wall_s"] = time.monotonic() - started
        return result
    chosen = after_gate or PlanAfterGate("study", lambda: plan(primary_seeds, secondary_seeds), analyse, "analysis")
    cells = chosen.cells()
    say(f"{chosen.name}: {sum(len(s) for *_, s in cells)} runs over {len(cells)} (condition, arm) cells")
    result["runs"] = run_cells(
        cfg, cells, url=url, env_spec=env_spec, workers=workers, show_progress=show_progress, desc=chosen.name,
        saved=saved if chosen.resumable else None,
    )  # fmt: skip
    result[chosen.result_key] = chosen.analyse(result["runs"])
    result["wall_s"] = time.monotonic() - started
    return result


@dataclass(frozen=True)
class PlanAfterGate:
    """What a toy study runs once its gate has passed, as data: its name (the progress line's), its
    (condition, arm, seeds) cells, how it judges the runs, where in ``results.json`` the judgement
    goes, and whether its runs are kept in ``saved`` as they finish (as each plan ran: the second
    follow-up's are)."""

    name: str
    cells: Callable[[], list[tuple[str, str, list[int]]]]
    analyse: Callable[[list[dict[str, Any]]], Any]
    result_key: str
    resumable: bool = False


def _progress_bar(total: int, show: bool, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="step", unit_scale=True, desc=desc, disable=not show, smoothing=0.05)


__all__ = ["ARMS", "GATE", "MARGIN", "PRIMARY", "SECONDARY", "analyse", "gate", "plan", "run_study"]
