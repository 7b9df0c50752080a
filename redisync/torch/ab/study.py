"""The A/B study: every arm × seed trained in worker processes, summarised per run, then per arm.

Runs are independent (each has a run id of its own in the store), so they spread over worker
processes; a progress bar follows the env steps of all of them. ``results.json`` keeps the
configuration, every run's curves and the summaries, so the report can be rebuilt from it.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import queue
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .fleet import ARMS, EnvFactory, Evaluation, StudyConfig, default_env, random_policy, run_arm
from .stats import diff_ci, mean_ci

SUMMARY_METRICS = {
    # metric: (description, higher is better)
    "final_return": ("evaluation return, mean of the last 3 evaluations", True),
    "mean_return": ("evaluation return averaged over the whole run (sample efficiency)", True),
    "final_survival": ("survival over all bins, last 3 evaluations", True),
    "final_hard_survival": ("survival on the hardest bins, last 3 evaluations", True),
    "steps_to_threshold": ("env steps until the hardest bins' survival first reaches the threshold (budget if never)", False),
    "mean_drift_tv": ("TV distance of the shards' sampling distributions from the pooled one, run average", False),
    "mean_buffer_tv": ("TV distance of the mixture the replay buffer receives from the pooled one, run average", False),
    "sync_overhead_pct": ("collector time spent in sync calls, % of collection time", False),
}


def load_env_factory(spec: str | None, cfg: StudyConfig) -> EnvFactory:
    """``module:function`` returning a :data:`EnvFactory` for the study's task config, or the built-in task."""
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


def hard_bins(cfg: StudyConfig, env_spec: str | None) -> list[int]:
    """The hardest bins: the env's own ``hard_bins`` mask if it has one, else the built-in task's."""
    env = load_env_factory(env_spec, cfg)(torch.zeros(1, dtype=torch.long), 0)
    mask = getattr(env, "hard_bins", None)
    if mask is None:
        mask = cfg.task.layout()[0]
    return [int(i) for i in torch.as_tensor(mask).nonzero().flatten()]


def summarise_run(run: dict[str, Any], hard: Sequence[int], cfg: StudyConfig) -> dict[str, float]:
    curve = run["curve"]
    last = curve[-3:]
    hard_curve = [float(np.mean([row["survival"][b] for b in hard])) for row in curve]
    reached = next((row["env_steps"] for row, s in zip(curve, hard_curve) if s >= cfg.survival_threshold), None)
    drift = [float(np.mean(d["tv"])) for d in run["drift"] if d["tv"]]
    buffer_drift = [d["buffer_tv"] for d in run["drift"] if d["buffer_tv"] is not None]
    return {
        "final_return": float(np.mean([r["return"] for r in last])),
        "mean_return": float(np.mean([r["return"] for r in curve])),
        "final_survival": float(np.mean([np.mean(r["survival"]) for r in last])),
        "final_hard_survival": float(np.mean(hard_curve[-3:])),
        "steps_to_threshold": float(reached if reached is not None else cfg.env_steps),
        "reached_threshold": float(reached is not None),
        "mean_drift_tv": float(np.mean(drift)) if drift else 0.0,
        "final_drift_tv": drift[-1] if drift else 0.0,
        "mean_buffer_tv": float(np.mean(buffer_drift)) if buffer_drift else 0.0,
        "sync_overhead_pct": 100.0 * run["sync_s"] / max(run["collect_s"], 1e-9),
        "wall_s": run["wall_s"],
    }


def summarise(runs: list[dict[str, Any]], arms: Sequence[str], reference: str = "pooled") -> dict[str, Any]:
    """Per arm and metric the mean over seeds with its 95% interval; per arm its difference from ``reference``."""
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in arms}
    per_arm = {a: {m: mean_ci([r["summary"][m] for r in rs]).to_dict() for m in [*SUMMARY_METRICS, "reached_threshold", "wall_s"]}
               for a, rs in by_arm.items() if rs}
    diffs: dict[str, Any] = {}
    if reference in by_arm and by_arm[reference]:
        ref = by_arm[reference]
        for a, rs in by_arm.items():
            if a != reference and rs:
                diffs[a] = {m: diff_ci([r["summary"][m] for r in rs], [r["summary"][m] for r in ref]).to_dict()
                            for m in SUMMARY_METRICS}
    return {"reference": reference, "per_arm": per_arm, "differences": diffs}


def _worker(cfg_dict: dict[str, Any], arm: str, seed: int, url: str | None, env_spec: str | None, progress: Any) -> dict[str, Any]:
    cfg = StudyConfig.from_dict(cfg_dict)
    return run_arm(cfg, arm, seed, url, load_env_factory(env_spec, cfg), on_progress=progress.put)


def run_study(cfg: StudyConfig, arms: Sequence[str], seeds: Sequence[int], *, url: str | None = None,
              env_spec: str | None = None, workers: int = 2, show_progress: bool = True,
              on_run: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Every arm × seed; returns what ``results.json`` holds."""
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise ValueError(f"unknown arm(s) {unknown}; the arms are {list(ARMS)}")
    hard = hard_bins(cfg, env_spec)
    evaluation = Evaluation(cfg, load_env_factory(env_spec, cfg))
    random_eval = evaluation.run(random_policy(evaluation.env.act_dim, 0))
    jobs = [(arm, seed) for seed in seeds for arm in arms]
    total = len(jobs) * cfg.env_steps
    bar = _progress_bar(total, show_progress)
    runs: list[dict[str, Any]] = []
    ctx = mp.get_context("spawn")  # torch and the syncers' threads do not survive a fork
    with ctx.Manager() as manager, ctx.Pool(workers) as pool:
        progress = manager.Queue()
        pending = [pool.apply_async(_worker, (cfg.to_dict(), arm, seed, url, env_spec, progress)) for arm, seed in jobs]
        while pending:
            try:
                bar.update(progress.get(timeout=0.5))
            except queue.Empty:
                pass
            for job in [p for p in pending if p.ready()]:
                pending.remove(job)
                run = job.get()  # a failed run raises here, with its worker's traceback
                run["summary"] = summarise_run(run, hard, cfg)
                runs.append(run)
                bar.set_postfix_str(f"{run['arm']} seed {run['seed']}: return {run['summary']['final_return']:.1f}")
                if on_run is not None:
                    on_run(run)
        while not progress.empty():
            bar.update(progress.get())
    bar.close()
    runs.sort(key=lambda r: (list(arms).index(r["arm"]), r["seed"]))
    return {
        "config": cfg.to_dict(), "arms": list(arms), "seeds": list(seeds), "env": env_spec or "built-in point-mass tracking",
        "store": url or "embedded", "hard_bins": hard,
        "random": {"return": random_eval["return"], "survival": random_eval["survival"],
                   "final_hard_survival": float(np.mean([random_eval["survival"][b] for b in hard]))},
        "runs": runs, "summary": summarise(runs, arms),
    }


def _progress_bar(total: int, show: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="step", unit_scale=True, desc="A/B study", disable=not show, smoothing=0.05)
