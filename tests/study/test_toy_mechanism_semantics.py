"""The second follow-up (`redisync.study.plans.toy_mechanism_semantics`): its tie margin from the first follow-up's
curves, and each question answered with its interval, ties counted as zero."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from redisync.study.fleet import ARMS
from redisync.study.plans import toy_mechanism_semantics as plan

from .fake_runs import fake_runs


def test_the_second_follow_ups_tie_is_the_plateau_jitter_of_the_first_follow_up():
    """TIE was fixed before the runs from the first follow-up's curves: the 99th percentile of a
    plateau's range (0.0052), rounded up; it stays below any segment newly tracked (0.05)."""
    first = json.loads((Path(__file__).parents[2] / "records/ab/follow-up/results.json").read_text())
    jitter = plan.plateau_jitter(first["runs"] + first["gate_runs"])
    assert jitter == pytest.approx(0.0052, abs=5e-5)
    assert math.ceil(jitter * 1000) / 1000 == plan.TIE
    assert plan.plateau_jitter(
        [{"curve": [{"completion": c} for c in (0.1, 0.104, 0.5, 0.503, 0.5)]}], quantile=100
    ) == (pytest.approx(0.004))


def test_the_second_follow_up_answers_each_question_with_its_interval_and_ties_at_zero():
    """A and C one-sided, B worse/better/equivalent/inconclusive with Holm over its four; a difference
    within TIE counts as 0 in the tests only; a question is tested only once all its seeds ran."""
    arms = {(c.condition, a) for c in plan.CONTRASTS for a in (c.a, c.b)}
    cells = plan.order(plan.arms_needed())
    assert {(c, a) for c, a, _ in cells} == arms
    assert all(a in ARMS for _, a in arms)
    first = {(c.condition, a): c.question for c in reversed(plan.CONTRASTS) for a in (c.a, c.b)}
    assert [first[(c, a)] for c, a, _ in cells] == sorted(first[(c, a)] for c, a, _ in cells)  # A, then B, then C
    means = {cell: 0.6 for cell in arms} | {
        ("H", "local-paper-16-shards"): 0.4,  # A: harm
        ("H", "broadcast-16-shards"): 0.3,  # B on H: worse
        ("H", "weighted-16-shards"): 0.6,  # B on H: equivalent
        ("X", "broadcast-16-shards"): 0.9,  # B on X: better
        ("H", "local-8-shards"): 0.6,  # C at 128: no harm
        ("H", "local-16-shards"): 0.3,
    }
    rng = np.random.default_rng(1)
    runs = fake_runs(means, plan.SEEDS, rng)
    for r in runs:  # X weighted: a spread no 10 seeds can call equivalent or different
        if (r["condition"], r["arm"]) == ("X", "weighted-16-shards"):
            r["summary"]["completion_auc"] = 0.6 + (0.3 if r["seed"] % 2 else -0.29)
    out = {r["contrast"]: r for r in plan.analyse(runs)}
    a = out["H: local-paper-16-shards − pooled-paper-16-shards"]
    assert a["rejected"]
    assert a["decision"] == plan.DECISIONS["A"][0]
    assert a["lo"] < a["mean"] < a["hi"] < 0
    assert a["effect_size"] < -5
    verdicts = {k: r["verdict"] for k, r in out.items() if r["question"] == "B"}
    assert verdicts == {
        "H: broadcast-16-shards − pooled-16-shards": "worse",
        "H: weighted-16-shards − pooled-16-shards": "equivalent",
        "X: broadcast-16-shards − pooled-16-shards": "better",
        "X: weighted-16-shards − pooled-16-shards": "inconclusive",
    }
    c = out["H: local-8-shards − pooled-8-shards"]
    assert not c["rejected"]
    assert c["decision"] == plan.DECISIONS["C"][1]
    assert out["H: local-16-shards − pooled-16-shards"]["confirmatory"] is False
    assert "decision" not in out["H: local-16-shards − pooled-16-shards"]
    # ties: ten differences of −0.005 (inside TIE) test as zeros, though all are negative
    tied = [r | {"summary": {**r["summary"], "completion_auc": 0.5 - 0.005}} if r["arm"] == "local-8-shards" else r
            for r in runs if r["arm"] in ("local-8-shards", "pooled-8-shards")]  # fmt: skip
    for r in tied:
        if r["arm"] == "pooled-8-shards":
            r["summary"] = {**r["summary"], "completion_auc": 0.5}
    c = {r["contrast"]: r for r in plan.analyse(tied)}["H: local-8-shards − pooled-8-shards"]
    assert c["ties"] == 10
    assert c["p_one_sided"] == 1.0
    assert not c["rejected"]
    # a question part way: described, not tested
    part = [r for r in runs if not (r["arm"] == "pooled-paper-16-shards" and r["seed"] == plan.SEEDS[-1])]
    a = {r["contrast"]: r for r in plan.analyse(part)}["H: local-paper-16-shards − pooled-paper-16-shards"]
    assert not a["complete"]
    assert len(a["seeds"]) == 9
    assert "p_one_sided" not in a
    assert "rejected" not in a
