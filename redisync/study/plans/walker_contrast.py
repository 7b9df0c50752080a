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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..fleet import StudyConfig
from ..learner import SACConfig
from ..runner import Stage, run_stages
from ..task import TaskConfig

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


def _pilot_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary = pilot_summary(runs)
    summary["pilot"], summary["learnable"] = PILOT, learnable(summary)
    return summary


def _unlearnable(summary: dict[str, Any]) -> str | None:
    if summary["learnable"] is False:
        return (
            f"the oracle did not learn the skill segments (final skill success below {LEARNABLE_SUCCESS}): the task "
            "changes before anything else runs"
        )
    return None


def run_pilots(
    out: Path, *, workers: int, show_progress: bool = False, on_stage: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The pilots, each run kept in ``out/pilot-<PILOT>`` as it finishes (the same call again resumes),
    and ``out/pilot-<PILOT>.json`` written from the runs so far; they stop when the oracle did not learn."""
    stages = [
        Stage(f"pilot: {arm}, seeds {seeds}", [(c, arm, seeds)], f"pilot {arm}") for c, arm, seeds in pilot_cells()
    ]
    return run_stages(
        CONFIG, ENV, stages, _pilot_summary, saved=out / f"pilot-{PILOT}", summary_path=out / f"pilot-{PILOT}.json",
        workers=workers, show_progress=show_progress, on_stage=on_stage, stop=_unlearnable,
    )  # fmt: skip


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
    stages = [
        Stage(f"gate: {arm}, seeds {list(GATE_SEEDS)}", [("H", arm, GATE_SEEDS)], f"gate {arm}")
        for arm in ("single", "uniform")
    ]
    return run_stages(
        CONFIG, ENV, stages, gate_summary, saved=out / "gate", summary_path=out / "gate.json",
        workers=workers, show_progress=show_progress, on_stage=on_stage,
    )  # fmt: skip


CONTRAST_ALPHA = 0.05  # the one-sided paired t-test's level (docs/ab/fourth-study-plan.md)
CONTRAST_MARGIN = 0.1  # the equivalence test's margin, in skill success AUC


def contrast_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The primary contrast local − pooled in skill success AUC on the contrast seeds: the paired
    differences so far and, once every seed ran both arms, the plan's tests (a one-sided paired t-test
    of "local lower" at `CONTRAST_ALPHA`; TOST with margin `CONTRAST_MARGIN`) and its verdict."""
    from scipy import stats as scipy_stats

    from ..stats import contrast

    table = {(run["arm"], run["seed"]): run["summary"][PRIMARY_METRIC] for run in runs}
    shares = {(run["arm"], run["seed"]): run["summary"]["skill_share"] for run in runs}
    seeds = [s for s in CONTRAST_SEEDS if ("local", s) in table and ("pooled", s) in table]
    out: dict[str, Any] = {
        "seeds": list(CONTRAST_SEEDS),
        "local": {s: table.get(("local", s)) for s in CONTRAST_SEEDS},
        "pooled": {s: table.get(("pooled", s)) for s in CONTRAST_SEEDS},
        "skill_share": {arm: {s: shares.get((arm, s)) for s in CONTRAST_SEEDS} for arm in SD_ARMS},
        "differences": {s: table[("local", s)] - table[("pooled", s)] for s in seeds},
        "done": len(seeds) == len(CONTRAST_SEEDS),
    }
    if not out["done"]:
        return out
    a, b = [table[("local", s)] for s in seeds], [table[("pooled", s)] for s in seeds]
    c = contrast("local - pooled", a, b, CONTRAST_MARGIN)
    d = np.asarray(a) - np.asarray(b)
    p_lower = float(scipy_stats.ttest_1samp(d, 0.0, alternative="less").pvalue)
    harm, same = p_lower < CONTRAST_ALPHA, c.p_equivalence < CONTRAST_ALPHA
    out |= {
        "mean": c.mean,
        "ci95": [c.lo, c.hi],
        "p_one_sided_t": p_lower,
        "p_equivalence": c.p_equivalence,
        "ci90": [c.lo90, c.hi90],
        "p_sign_flip_two_sided": c.p_sign_flip,
        "verdict": "local lower" if harm else ("equivalent" if same else "inconclusive"),
    }
    return out


def gate_passed(out: Path) -> bool:
    """Whether the gate's run files in ``out/gate`` (not a summary that could be edited) say it passed."""
    from ..study import condition_config, load_run

    cfg = condition_config(CONFIG, "H")
    runs = [load_run(out / "gate", cfg, arm, seed) for arm in ("single", "uniform") for seed in GATE_SEEDS]
    return gate_summary([r for r in runs if r is not None])["passed"] is True


def run_contrast(
    out: Path, *, workers: int, show_progress: bool = False, on_stage: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """The primary contrast, seed by seed (local and pooled side by side, so that pairs finish
    together), each run kept in ``out/contrast`` as it finishes (the same call again resumes) and
    ``out/contrast.json`` written from the runs so far. Refused unless the gate passed."""
    from ... import errors

    if not gate_passed(out):
        raise errors.ConfigurationError(
            f"{out / 'gate'}: the fourth study's gate has not passed on its run files; the plan runs the "
            "contrast only after it has (redisync ab --plan walker-contrast --stage gate)"
        )
    # local and pooled side by side, seed by seed, so that pairs finish together
    stages = [
        Stage(
            f"contrast: local and pooled, seed {seed}", [("H", arm, [seed]) for arm in SD_ARMS], f"contrast seed {seed}"
        )
        for seed in CONTRAST_SEEDS
    ]
    return run_stages(
        CONFIG, ENV, stages, contrast_summary, saved=out / "contrast", summary_path=out / "contrast.json",
        workers=workers, show_progress=show_progress, on_stage=on_stage,
    )  # fmt: skip
