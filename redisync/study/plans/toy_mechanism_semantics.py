"""The second pre-registered follow-up: the mechanism, the seed's semantics question, where the harm ends.

Fixed here, in code, and in ``docs/ab/second-follow-up-plan.md``, before its first run:

- Fresh seeds (`SEEDS`): none of the study's, the gate's or the first follow-up's.
- Three questions, each its own family at α = 0.05 (they decide different things in the product):
  **A** the mechanism (one one-sided test), **B** which semantics (four contrasts, each judged
  *worse*, *better*, *equivalent* within `MARGIN_B` or *inconclusive*, Holm over the four for
  both kinds of claim), **C** where the harm ends (one one-sided test at 128 envs per shard, the 64
  and 256 ones beside it descriptive).
- **Ties**: a per-seed difference within `TIE` (the plateau jitter measured on the first
  follow-up's runs, `plateau_jitter`) counts as 0 in the sign-flip tests; the t-intervals and
  effect sizes are computed on the raw differences.
- Every answer prints its mean difference, its 95 % t-interval and its effect size (dz = mean / sd).
- What each outcome changes in the product is stated beside it (`DECISIONS`), before the runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from ..stats import differences, equivalence_p, holm, sign_flip_p, t_interval
from .toy_dose_mechanism import one_sided_sign_flip_p

if TYPE_CHECKING:
    from ..fleet import StudyConfig
    from ..study import PlanAfterGate

SEEDS = tuple(range(300, 310))  # 10 fresh seeds
ALPHA = 0.05
MARGIN_B = 0.05  # B's equivalence margin in completion AUC
TIE = 0.006  # plateau jitter: the 99th percentile of a plateau's range in the first follow-up's runs (0.0052)


def plateau_jitter(runs: list[dict[str, Any]], step: float = 0.02, quantile: float = 99.0) -> float:
    """How much completion moves while a run stays on one plateau: over every run's evaluations,
    the range of each maximal stretch of consecutive evaluations within ``step`` of the stretch's
    first value (a new segment tracked moves completion by 0.05 or more); the ``quantile`` of those
    ranges. `TIE` is this, rounded up, on ``records/ab/follow-up/results.json``."""
    ranges = []
    for run in runs:
        c = [row["completion"] for row in run["curve"]]
        i = 0
        while i < len(c):
            j = i
            while j + 1 < len(c) and abs(c[j + 1] - c[i]) < step:
                j += 1
            if j > i:
                ranges.append(max(c[i : j + 1]) - min(c[i : j + 1]))
            i = j + 1
    return float(np.percentile(ranges, quantile))


@dataclass(frozen=True)
class Contrast:
    """``a − b`` on ``condition`` over the first ``seeds`` of `SEEDS`."""

    question: str  # "A", "B" or "C"
    condition: str
    a: str
    b: str
    seeds: int = len(SEEDS)
    direction: str | None = None  # "less": a one-sided test; None: B's two-sided and equivalence tests
    confirmatory: bool = True

    @property
    def name(self) -> str:
        return f"{self.condition}: {self.a} − {self.b}"


CONTRASTS: tuple[Contrast, ...] = (
    # A: with the paper's mix (which does not flatten a small shard's EMA), does drift alone hurt?
    Contrast("A", "H", "local-paper-16-shards", "pooled-paper-16-shards", direction="less"),
    # B: the seed's semantics question at 64 envs per shard, on identical and on different shards
    Contrast("B", "H", "broadcast-16-shards", "pooled-16-shards"),
    Contrast("B", "H", "weighted-16-shards", "pooled-16-shards"),
    Contrast("B", "X", "broadcast-16-shards", "pooled-16-shards"),
    Contrast("B", "X", "weighted-16-shards", "pooled-16-shards"),
    # C: where the harm ends: 128 envs per shard tested, 64 and 256 beside it
    Contrast("C", "H", "local-8-shards", "pooled-8-shards", direction="less"),
    Contrast("C", "H", "local-16-shards", "pooled-16-shards", direction="less", confirmatory=False),
    Contrast("C", "H", "local", "pooled", direction="less", confirmatory=False),
)

QUESTIONS = {
    "A": "mechanism: with the paper's uniform mix (no flattening of a small shard's EMA), do unsynced 64-env "
    "shards still do worse than pooled ones?",
    "B": "semantics: at 64 envs per shard, is holosoma's rank-0 broadcast or the failure-weighted merge worse, "
    "better or equivalent (±0.05) to the exact pooled sum, on identical (H) and different (X) shards?",
    "C": "where the harm ends: at 128 envs per shard, do unsynced shards do worse than pooled ones (64 and 256 "
    "beside it)?",
}

DECISIONS = {
    "A": (
        "the docs say drift itself hurts small shards, whatever the uniform mix: sync them (the interval quoted)",
        "the docs say the harm shown at 64 envs per shard is the code mix's flattening of a small shard's EMA, which "
        "the sampler's warning measures; no claim that drift alone hurts",
    ),
    "B": (
        # per contrast: worse, better, equivalent, inconclusive
        "worse: the frameworks guide says so where a drop-in offers that semantics (holosoma's broadcast stays for "
        "parity, documented as worse with its interval); better on both H and X: it becomes the drop-ins' default; "
        "equivalent: the docs say the choice does not change the curriculum on this task within ±0.05",
        "inconclusive: the docs say it is not shown either way; pooled stays the default (the exact fleet sum)",
    ),
    "C": (
        "the sampler's warning rule is checked against the 128-env arm: if it stayed quiet there, its thresholds "
        "are lowered until it fires on that arm and still never on a single collector",
        "the docs say harm is shown at 64 envs per shard and not at 128; where the warning fires at 128, they say "
        "it fires earlier than harm was shown",
    ),
}


def arms_needed() -> list[tuple[str, str, list[int]]]:
    """Every (condition, arm) the contrasts need, with its seeds: the most any contrast asks for."""
    need: dict[tuple[str, str], int] = {}
    for c in CONTRASTS:
        for arm in (c.a, c.b):
            need[(c.condition, arm)] = max(need.get((c.condition, arm), 0), c.seeds)
    return [(cond, arm, list(SEEDS[:n])) for (cond, arm), n in sorted(need.items())]


def order(cells: list[tuple[str, str, list[int]]]) -> list[tuple[str, str, list[int]]]:
    """The cells in the order the runs go: A's first, then B's, then C's, so that a study stopped
    part way has answered its first questions whole."""
    first: dict[tuple[str, str], int] = {}
    for i, c in enumerate(CONTRASTS):
        for arm in (c.a, c.b):
            first.setdefault((c.condition, arm), i)
    return sorted(cells, key=lambda cell: first[(cell[0], cell[1])])


def untied(values: ArrayLike) -> np.ndarray:
    """The differences the sign-flip tests see: within `TIE` of 0 counts as 0."""
    d = np.asarray(values, dtype=np.float64)
    return np.where(np.abs(d) <= TIE, 0.0, d)


def _values(runs: list[dict[str, Any]], condition: str, arm: str, metric: str) -> dict[int, float]:
    return {r["seed"]: r["summary"][metric] for r in runs if r["condition"] == condition and r["arm"] == arm}


def per_seed(runs: list[dict[str, Any]], c: Contrast, metric: str = "completion_auc") -> tuple[list[int], np.ndarray]:
    """The contrast's per-seed differences, over those of its seeds that both arms ran."""
    va, vb = _values(runs, c.condition, c.a, metric), _values(runs, c.condition, c.b, metric)
    seeds = sorted(set(SEEDS[: c.seeds]) & set(va) & set(vb))
    if len(seeds) < 2:
        return seeds, np.zeros(0)
    return seeds, differences([va[s] for s in seeds], [vb[s] for s in seeds])


def _describe(c: Contrast, seeds: list[int], d: np.ndarray) -> dict[str, Any]:
    lo, hi = t_interval(d) if d.size >= 2 else (math.nan, math.nan)
    sd = float(d.std(ddof=1)) if d.size >= 2 else math.nan
    return {
        "question": c.question,
        "contrast": c.name,
        "confirmatory": c.confirmatory,
        "seeds": seeds,
        "complete": len(seeds) == c.seeds,
        "differences": d.tolist(),
        "ties": int(np.sum(np.abs(d) <= TIE)),
        "mean": float(d.mean()) if d.size else math.nan,
        "lo": lo,
        "hi": hi,
        "effect_size": float(d.mean() / sd) if sd and sd > 0 else math.nan,
    }


def analyse(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every contrast with its interval and effect size; a question's test only once all its seeds ran."""
    out = [_describe(c, *per_seed(runs, c)) for c in CONTRASTS]
    for c, row in zip(CONTRASTS, out, strict=True):
        if c.direction is not None and row["complete"]:
            row["p_one_sided"] = one_sided_sign_flip_p(untied(row["differences"]), c.direction)
            row["rejected"] = c.confirmatory and row["p_one_sided"] < ALPHA
            if c.confirmatory:
                row["decision"] = DECISIONS[c.question][0 if row["rejected"] else 1]
    b = [(c, row) for c, row in zip(CONTRASTS, out, strict=True) if c.question == "B"]
    if b and all(row["complete"] for _, row in b):
        differ = holm([sign_flip_p(untied(row["differences"])) for _, row in b])
        same = holm([equivalence_p(row["differences"], MARGIN_B) for _, row in b])
        for (_, row), p, q in zip(b, differ, same, strict=True):
            lo90, hi90 = t_interval(row["differences"], 0.90)
            row |= {"p_holm": p, "p_equivalence_holm": q, "lo90": lo90, "hi90": hi90}
            row["verdict"] = (
                ("worse" if row["mean"] < 0 else "better")
                if p < ALPHA
                else "equivalent"
                if q < ALPHA
                else "inconclusive"
            )
            row["decision"] = DECISIONS["B"][1 if row["verdict"] == "inconclusive" else 0]
    return out


def after_gate() -> PlanAfterGate:
    """This plan as the toy runner takes it after the gate (`redisync.study.study.run_study`): its runs
    in the order they are run, its analysis, kept in ``saved`` as each finishes (resumable)."""
    from ..study import PlanAfterGate

    return PlanAfterGate("second follow-up", lambda: order(arms_needed()), analyse, "second_follow_up", resumable=True)


def saved_results(saved: Path, cfg: StudyConfig, command: str) -> dict[str, Any]:
    """What ``results.json`` of the second follow-up holds, from the runs saved so far (a study still
    going, or stopped to be resumed): the gate, the runs done and the analysis of what they allow."""
    import datetime

    from ..study import GATE_SEEDS, _read_saved, gate

    runs = []
    for path in sorted(saved.glob("*.json")):
        runs.append(_read_saved(path)["run"])
    gate_runs = [r for r in runs if r["arm"] in ("single", "uniform") and r["seed"] in GATE_SEEDS]
    plan_runs = sorted((r for r in runs if r not in gate_runs), key=lambda r: (r["condition"], r["arm"], r["seed"]))
    cells = arms_needed()
    return {
        "config": cfg.to_dict(),
        "env": "built-in skill tracking",
        "store": "embedded",
        "date": datetime.date.today().isoformat(),
        "workers": 2,
        "gate": gate(gate_runs),
        "gate_runs": gate_runs,
        "sync": f"synced in lockstep every {cfg.publish_every_steps} fleet steps (every shard publishes, then every "
        "shard takes the fleet state)",
        "runs": plan_runs,
        "planned_runs": sum(len(seeds) for *_, seeds in cells),
        "analysis": None,
        "second_follow_up": analyse(plan_runs),
        "command": command,
    }
