"""The first follow-up (`redisync.study.plans.toy_dose_mechanism`): its hypotheses answered in their fixed sequence,
each with the decision fixed beforehand (its run in miniature: tests/study/test_study.py)."""

from __future__ import annotations

import numpy as np
import pytest

from redisync.study.fleet import ARMS
from redisync.study.plans import toy_dose_mechanism as follow_up

from .fake_runs import fake_runs


def test_the_follow_up_answers_in_its_fixed_sequence():
    """P1..P4 in order, each tested only if every one before it was rejected; P4 on the difference
    of two differences; each outcome names the product decision the plan fixed beforehand."""
    rng = np.random.default_rng(0)
    arms = {(h.condition, a) for h in follow_up.HYPOTHESES for a in h.arms()}
    assert {(c, a) for c, a, _ in follow_up.cells()} == arms
    assert all(a in ARMS for _, a in arms)
    harm = {
        ("H", "local-16-shards"): 0.3,
        ("H", "pooled-16-shards"): 0.6,
        ("H", "local-paper-16-shards"): 0.6,  # P2: no harm with the paper's mix
        ("H", "local"): 0.6,
        ("H", "pooled"): 0.6,
        ("X", "per-profile"): 0.9,
        ("X", "pooled"): 0.5,
    }
    answers = follow_up.analyse(fake_runs(harm, follow_up.SEEDS, rng))
    assert [h["name"] for h in answers] == ["P1", "P2", "P3", "P4"]
    assert answers[0]["rejected"]
    assert answers[0]["p_one_sided"] == pytest.approx(1 / 64)
    assert answers[1]["tested"]
    assert not answers[1]["rejected"]
    assert not answers[2]["tested"]
    assert not answers[2]["rejected"]
    assert answers[2]["mean"] == pytest.approx(0.4, abs=0.02)
    assert len(answers[2]["seeds"]) == 8
    assert answers[3]["mean"] == pytest.approx(-0.3, abs=0.02)  # (0.3 − 0.6) − (0.6 − 0.6)
    assert answers[0]["decision"] == follow_up.DECISIONS["P1"][0]
    assert answers[1]["decision"] == follow_up.DECISIONS["P2"][1]
