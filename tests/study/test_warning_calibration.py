"""The drift warning against the harm the second follow-up measured, from its committed run files
(the plan: docs/ab/warning-calibration-plan.md)."""

from __future__ import annotations

import json
from pathlib import Path

from redisync.study import warning_calibration as calibration
from redisync.terms.formulas import WARNING_THRESHOLDS

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "records" / "ab" / "second-follow-up" / "runs"


def test_the_sampler_warns_where_harm_was_shown_and_not_on_the_arm_where_none_was():
    """With the sampler's thresholds: every seed of the 64- and 128-env arms (both mixes) fires, no seed
    of the 256-env arm does. With the thresholds before the calibration the negative control fired on
    every seed (the rule could not tell harm from none), so the criterion fails."""
    fired = calibration.firing(RUNS, WARNING_THRESHOLDS)
    assert {arm: len(f) for arm, f in fired.items()} == {arm: 10 for arm in (*calibration.HARM_SHOWN, "local")}
    assert calibration.meets_criterion(fired)
    assert {arm: sum(f) for arm, f in fired.items()} == {
        "local-16-shards": 10,
        "local-8-shards": 10,
        "local-paper-16-shards": 10,
        "local": 0,
    }
    before = calibration.firing(RUNS, calibration.TODAY)
    assert sum(before["local"]) == 10  # the negative control can fail, and did
    assert not calibration.meets_criterion(before)


def test_the_committed_calibration_recomputes_from_the_runs_and_chose_the_sampler_s_thresholds():
    """records/ab/warning-calibration.json and its report are what the plan's grid and tie rule give on the
    committed runs, and the chosen point is the sampler's rule."""
    committed = json.loads((ROOT / "records" / "ab" / "warning-calibration.json").read_text())
    result = calibration.calibrate(RUNS)
    result["runs"] = committed["runs"]
    assert result == committed
    assert committed["chosen"]["rule"] == vars(WARNING_THRESHOLDS)
    assert (ROOT / "docs" / "ab" / "warning-calibration.md").read_text() == calibration.report(result)


def test_the_collector_guide_states_the_calibrated_rule_and_its_figures():
    """The guide's thresholds are the sampler's, and its seed counts the committed calibration's."""
    committed = json.loads((ROOT / "records" / "ab" / "warning-calibration.json").read_text())
    guide = " ".join((ROOT / "docs" / "guides" / "collector.md").read_text().split())
    rule, fired = WARNING_THRESHOLDS, committed["chosen"]["seeds_fired"]
    assert f"a relative noise of {rule.noisy_relative_sd} or more" in guide
    assert f"or a uniform share of {rule.flat_uniform_share} or more" in guide
    assert f"noise of {rule.fair_relative_sd} or less" in guide
    assert f"and a uniform share of {rule.fair_uniform_share} or less" in guide
    assert all(fired[arm] == 10 for arm in calibration.HARM_SHOWN)
    assert "fires on 10 of 10 seeds of each arm where unsynced shards trained worse" in guide
    assert f"on {fired['local']} of 10 seeds of the arm of 256 envs per shard" in guide
    assert f"fired on all {committed['today']['seeds_fired']['local']} there" in guide
    assert "a warning is a risk, not proof of harm" in guide
