"""The pre-registered follow-up: when does not syncing hurt? Dose, mechanism, heterogeneity.

Fixed here, in code, and in ``docs/ab/follow-up-plan.md``, before its first run (issue 26):

- Fresh seeds (`SEEDS`), not the study's nor the gate's.
- Four hypotheses answered in a **fixed sequence** at α = 0.05 each: a hypothesis is tested only
  if every one before it was rejected, which holds the family-wise error at 0.05 without a
  correction; once one is not rejected, the rest are reported as descriptive only.
- Each test is an exact one-sided sign-flip test on the per-seed differences of the primary
  metric (``completion_auc``); P4 on the per-seed difference of two differences.
- Secondary metrics, descriptive: ``final_completion`` and ``steps_to_complete`` (the env steps at
  the first evaluation where the whole motion was tracked, the run's budget when never).
- What each outcome changes in the product is stated beside it (`DECISIONS`), before the runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats

from ..stats import differences

if TYPE_CHECKING:
    from ..study import PlanAfterGate

SEEDS = tuple(range(200, 208))  # 8 fresh seeds; the 6-seed hypotheses use the first 6
ALPHA = 0.05


@dataclass(frozen=True)
class Hypothesis:
    """``a − b`` (or, with ``c``/``d``, ``(a − b) − (c − d)``) on ``condition`` is ``direction`` 0."""

    name: str
    question: str
    condition: str
    a: str
    b: str
    direction: str  # "less" or "greater": the one-sided alternative
    seeds: int
    c: str | None = None
    d: str | None = None

    def arms(self) -> list[str]:
        return [x for x in (self.a, self.b, self.c, self.d) if x is not None]

    def label(self) -> str:
        core = f"{self.a} − {self.b}"
        return core if self.c is None else f"({core}) − ({self.c} − {self.d})"


HYPOTHESES: tuple[Hypothesis, ...] = (
    Hypothesis("P1", "dose: with 64 envs per shard, do unsynced shards do worse?", "H", "local-16-shards",
               "pooled-16-shards", "less", 6),
    Hypothesis("P2", "mechanism: is it drift, with the paper's mix that does not flatten a small shard's EMA?", "H",
               "local-paper-16-shards", "pooled-16-shards", "less", 6),
    Hypothesis("P3", "heterogeneity: on different shards, does pooling per profile beat one pooled distribution?",
               "X", "per-profile", "pooled", "greater", 8),
    Hypothesis("P4", "interaction: is the local − pooled gap larger (more negative) at 16 shards than at 4?", "H",
               "local-16-shards", "pooled-16-shards", "less", 6, c="local", d="pooled"),
)  # fmt: skip

DECISIONS = {
    "P1": (
        "the sampler warns once, at construction, when mode='local' with uniform_mix='code' runs fewer than "
        "256 envs per shard (the README states the threshold)",
        "no warning; the README withdraws 'unsynced shards fell far behind' at 64 envs per shard",
    ),
    "P2": (
        "the README says drift itself hurts small shards (not only the code mix's flattening): sync them",
        "the README says the small-shard harm is not shown to be drift: the code mix's flattening explains it as well",
    ),
    "P3": (
        "per-profile grouping becomes the default of the drop-ins wherever profile, terrain or motion ids exist",
        "the drop-ins keep one pooled distribution by default; the README says per-profile pooling is not shown better",
    ),
    "P4": (
        "the README states that syncing matters more the fewer envs a shard runs (the dose-response)",
        "no claim about the dose-response",
    ),
}


def cells() -> list[tuple[str, str, list[int]]]:
    """Every (condition, arm) the hypotheses need, with the seeds: the most any of them asks for."""
    need: dict[tuple[str, str], int] = {}
    for h in HYPOTHESES:
        for arm in h.arms():
            need[(h.condition, arm)] = max(need.get((h.condition, arm), 0), h.seeds)
    return [(c, a, list(SEEDS[:n])) for (c, a), n in sorted(need.items())]


def one_sided_sign_flip_p(values: ArrayLike, direction: str) -> float:
    """Exact one-sided p of the mean of ``d`` under random signs (all 2ⁿ patterns)."""
    d = np.asarray(values, dtype=np.float64)
    result = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", alternative=direction, n_resamples=math.inf
    )
    return float(result.pvalue)


def _values(runs: list[dict[str, Any]], condition: str, arm: str, metric: str) -> dict[int, float]:
    return {r["seed"]: r["summary"][metric] for r in runs if r["condition"] == condition and r["arm"] == arm}


def per_seed(runs: list[dict[str, Any]], h: Hypothesis, metric: str) -> tuple[list[int], np.ndarray]:
    """The hypothesis' per-seed differences on ``metric``, over its own pre-registered seeds (those
    every arm ran)."""
    values = {arm: _values(runs, h.condition, arm, metric) for arm in h.arms()}
    seeds = sorted(set(SEEDS[: h.seeds]).intersection(*(set(v) for v in values.values())))
    d = differences([values[h.a][s] for s in seeds], [values[h.b][s] for s in seeds])
    if h.c is not None and h.d is not None:
        d = d - differences([values[h.c][s] for s in seeds], [values[h.d][s] for s in seeds])
    return seeds, d


def analyse(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hypotheses in their fixed sequence: each one's estimate, p and whether it was tested."""
    out, open_ = [], True
    for h in HYPOTHESES:
        seeds, d = per_seed(runs, h, "completion_auc")
        p = one_sided_sign_flip_p(d, h.direction)
        rejected = open_ and p < ALPHA
        secondary = {m: float(per_seed(runs, h, m)[1].mean()) for m in ("final_completion", "steps_to_complete")}
        out.append(
            {
                "name": h.name,
                "question": h.question,
                "contrast": f"{h.condition}: {h.label()}",
                "direction": h.direction,
                "seeds": seeds,
                "mean": float(d.mean()),
                "differences": d.tolist(),
                "p_one_sided": p,
                "tested": open_,
                "rejected": rejected,
                "decision": DECISIONS[h.name][0 if rejected else 1],
                "secondary": secondary,
            }
        )
        open_ = rejected
    return out


def after_gate() -> PlanAfterGate:
    """This plan as the toy runner takes it after the gate (`redisync.study.study.run_study`)."""
    from ..study import PlanAfterGate

    return PlanAfterGate("follow-up", cells, analyse, "follow_up")
