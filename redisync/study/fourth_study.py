"""The fourth study: drift on a walker that can learn. Its pilots first, then (once they have
passed) a plan committed before the gate and the contrasts.

The task (`redisync.study.walker`, `make_learnable_env`): a 30-second gait with two mild skill
segments, a failure only after the error has stayed past the bound for 0.2 s (so a failed visit
yields at least ten transitions inside a segment). The budget: 16 shards × 32 envs (512 in all),
2 048 000 env steps, 8 SAC updates per fleet step, the EMA rate α = 0.01 (pilots 1-4: 0.001). The primary
endpoint: the share of evaluation rollouts started 1 s before a skill segment that reach its end
without a failure (``skill_success``), averaged over the run's evaluations; completion from frame 0
is secondary (its floor depends on where the first segment sits).

Pilots (their seeds are never reused by the gate or the contrasts):

- **learnability** (`LEARNABILITY_SEEDS`): one collector whose starts an oracle puts just before the
  skill segments (``oracle``), beside ``single`` (adaptive, one collector) and ``uniform``: can the
  learner learn a segment within the budget at all, given the data? If the oracle cannot, the task
  changes, never the gate.
- **paired sd** (`SD_SEEDS`): ``local`` and ``pooled`` at 16 × 32, for the paired difference's spread
  the contrasts' power is computed from.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .fleet import StudyConfig
from .learner import SACConfig
from .task import TaskConfig

ENV = "redisync.study.walker:make_learnable_env"
# pilots 1-3 ran a 30 s motion; there uniform starts learnt both segments as fast as adaptive ones (a
# 10 s episode from a uniform start passes a segment two times in three): pilot 4 runs 120 s
TASK = TaskConfig(bins=120, skill_segments=2, episode_s=10.0)
CONFIG = StudyConfig(
    shards=16,
    envs_per_shard=32,
    env_steps=2_048_000,  # 4 000 fleet steps
    learning_starts=51_200,
    updates_per_step=8,  # 31 000 SAC updates
    # pilots 1-4 ran BeyondMimic's 0.001 (made for ~10⁵ steps): in pilot 4 the adaptive sampler put only
    # 1.6-1.7 % of the experience in the segments; pilot 5 runs the study default, ten times faster
    sampler_alpha=0.01,
    eval_every=256_000,
    eval_rollouts=4,
    drift_every=128_000,
    skill_eval=True,
    task=TASK,
    sac=SACConfig(hidden=128, batch_size=512, buffer_size=2_048_000),
)
PRIMARY_METRIC = "skill_success_auc"
# the pilot's round: 1 and 2 failed learnability (no oracle learnt kind 2's deep crouch, whatever its remap);
# 3 passed it (kind 2 a kick of the left leg, the hips swapped) but uniform learnt as fast as single;
# 4 asks single against uniform first, on a 120 s motion: no reliable difference, the EMA concentrated
# little at α = 0.001; 5 asks the same at α = 0.01 (docs/ab/fourth-study/pilots.md)
PILOT = 5
LEARNABILITY_SEEDS = (600, 601)
SD_SEEDS = (610, 611, 612)
GATE_SEEDS = (620, 621, 622)  # fresh: never a pilot's
GATE = (
    0.2  # single − uniform in skill success AUC, the mean over GATE_SEEDS, at least this (docs/ab/fourth-study-plan.md)
)
CONTRAST_SEEDS = tuple(range(630, 640))
LEARNABILITY_ARMS = ("single", "uniform", "oracle")  # whether the curriculum can matter, first
SD_ARMS = ("local", "pooled")


LEARNABLE_SUCCESS = 0.75  # the learnability pilot passes when the oracle's final skill success reaches it on every seed


def learnable(summary: dict[str, Any]) -> bool | None:
    """Whether the learnability pilot passed (None until the oracle ran every pilot seed): the oracle,
    given starts just before the segments, ends with a skill success of at least `LEARNABLE_SUCCESS`
    on each seed (both segments on most rollouts)."""
    oracle = summary["arms"].get("oracle", {})
    if set(oracle) != set(LEARNABILITY_SEEDS):
        return None
    return all(oracle[s]["final_skill_success"] >= LEARNABLE_SUCCESS for s in LEARNABILITY_SEEDS)


def pilot_cells() -> list[tuple[str, str, list[int]]]:
    """Every pilot run, (condition, arm, seeds): learnability first, then the paired sd's."""
    return [("H", arm, list(LEARNABILITY_SEEDS)) for arm in LEARNABILITY_ARMS] + [
        ("H", arm, list(SD_SEEDS)) for arm in SD_ARMS
    ]


def pilot_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per pilot arm and seed, the primary and secondary endpoints; the paired sd of local − pooled."""
    table: dict[str, dict[int, dict[str, float]]] = {}
    for run in runs:
        s = run["summary"]
        table.setdefault(run["arm"], {})[run["seed"]] = {
            "skill_success_auc": s.get("skill_success_auc", float("nan")),
            "final_skill_success": s.get("final_skill_success", float("nan")),
            "completion_auc": s["completion_auc"],
            "skill_share": s["skill_share"],
        }
    out: dict[str, Any] = {"arms": table}
    local, pooled = table.get("local", {}), table.get("pooled", {})
    both = sorted(set(local) & set(pooled))
    if len(both) >= 2:
        d = np.array([local[k][PRIMARY_METRIC] - pooled[k][PRIMARY_METRIC] for k in both])
        out["paired_sd"] = {"seeds": both, "differences": d.tolist(), "sd": float(d.std(ddof=1))}
    return out


def run_pilots(
    out: Path, *, workers: int, show_progress: bool = False, on_stage: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The pilots, each run kept in ``out/pilot-<PILOT>`` as it finishes (the same call again resumes),
    and ``out/pilot-<PILOT>.json`` written from the runs so far."""
    from .study import run_cells

    say = on_stage or (lambda _: None)
    runs: list[dict[str, Any]] = []
    for cell in pilot_cells():
        say(f"pilot: {cell[1]}, seeds {cell[2]}")
        runs += run_cells(
            CONFIG, [cell], url=None, env_spec=ENV, workers=workers, show_progress=show_progress,
            desc=f"pilot {cell[1]}", saved=out / f"pilot-{PILOT}",
        )  # fmt: skip
        summary = pilot_summary(runs)
        summary["pilot"], summary["learnable"] = PILOT, learnable(summary)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"pilot-{PILOT}.json").write_text(json.dumps(summary, indent=1, default=float))
        if summary["learnable"] is False:
            say(f"the oracle did not learn the skill segments (final skill success below {LEARNABLE_SUCCESS}): the task "
                "changes before anything else runs")  # fmt: skip
            break
    return summary


def gate_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The gate's paired differences single − uniform in the primary endpoint, their mean, and
    whether it passed (None until every gate seed ran both arms)."""
    table = {(run["arm"], run["seed"]): run["summary"][PRIMARY_METRIC] for run in runs}
    seeds = [s for s in GATE_SEEDS if ("single", s) in table and ("uniform", s) in table]
    differences = {s: table[("single", s)] - table[("uniform", s)] for s in seeds}
    mean = float(np.mean(list(differences.values()))) if differences else None
    done = len(seeds) == len(GATE_SEEDS)
    return {
        "gate": GATE,
        "seeds": list(GATE_SEEDS),
        "single": {s: table.get(("single", s)) for s in GATE_SEEDS},
        "uniform": {s: table.get(("uniform", s)) for s in GATE_SEEDS},
        "differences": differences,
        "mean": mean,
        "passed": (mean is not None and mean >= GATE) if done else None,
    }


def run_gate(
    out: Path, *, workers: int, show_progress: bool = False, on_stage: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The gate on its fresh seeds, each run kept in ``out/gate`` as it finishes (the same call again
    resumes), and ``out/gate.json`` written from the runs so far."""
    from .study import run_cells

    say = on_stage or (lambda _: None)
    runs: list[dict[str, Any]] = []
    for arm in ("single", "uniform"):
        say(f"gate: {arm}, seeds {list(GATE_SEEDS)}")
        runs += run_cells(
            CONFIG, [("H", arm, list(GATE_SEEDS))], url=None, env_spec=ENV, workers=workers,
            show_progress=show_progress, desc=f"gate {arm}", saved=out / "gate",
        )  # fmt: skip
        summary = gate_summary(runs)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gate.json").write_text(json.dumps(summary, indent=1, default=float))
    return summary
