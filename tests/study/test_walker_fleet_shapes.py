"""The fifth study's plan as code: its configurations keep the fourth's 512 envs and budget, their
seeds are fresh, its stages interleave the configurations pair by pair, its power figures are the
plan page's, and its summary reads the runs it is given (a fake run per arm, nothing trained)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redisync.study.plans import walker_contrast as fourth_study
from redisync.study.plans import walker_fleet_shapes as fifth_study

ROOT = Path(__file__).resolve().parents[2]


def test_every_configuration_keeps_the_budget_and_its_seeds_are_fresh():
    """512 envs and the fourth's env steps in every configuration; no seed a pilot, gate or contrast
    of the fourth study used, none shared between configurations; pair i of each in turn."""
    used = {
        *fourth_study.LEARNABILITY_SEEDS, *fourth_study.SD_SEEDS, *fourth_study.GATE_SEEDS, *fourth_study.CONTRAST_SEEDS,
    }  # fmt: skip
    seen: set[int] = set()
    for c in fifth_study.CONFIGURATIONS:
        cfg = c.config()
        assert cfg.shards * cfg.envs_per_shard == 512
        assert cfg.env_steps == fourth_study.CONFIG.env_steps
        assert not set(c.seeds) & (used | seen)
        seen |= set(c.seeds)
    stages = fifth_study.stages()
    assert len(stages) == sum(len(c.seeds) for c in fifth_study.CONFIGURATIONS)
    assert [s.folder for s in stages[:3]] == [c.name for c in fifth_study.CONFIGURATIONS]


def test_the_power_figures_are_the_plans():
    """The fourth study's achieved MDE (ten pairs at sd 0.287) is 0.247, as the plan says."""
    page = (ROOT / "docs" / "ab" / "fifth-study-plan.md").read_text()
    assert fifth_study.minimum_detectable_effect(10) == pytest.approx(0.247, abs=5e-4)
    assert f"{fifth_study.minimum_detectable_effect(20):.3f} pooled with the fourth's 10" in page
    assert f"| {fifth_study.minimum_detectable_effect(6):.3f} |" in page
    predicted = json.loads((ROOT / "records" / "ab" / "fifth-study" / "predictions.json").read_text())
    for name, p in predicted["configurations"].items():
        assert f"| `{name}` | {p['advise_shard_distance']:.3f} | {p['simulated_shard_distance']:.3f} |" in page


def _fake(arm: str, seed: int, auc: float, tv: float) -> dict:
    return {
        "arm": arm,
        "seed": seed,
        "summary": {fifth_study.PRIMARY_METRIC: auc},
        "drift": [{"env_steps": 128_000 * (i + 1), "tv": [tv, tv]} for i in range(6)],
    }


def test_the_summary_pools_the_replication_with_the_fourths_pairs_and_judges_the_warning():
    """H1 counts the fourth's ten committed pairs with this study's; the warning fires on a local run
    whose recorded drift is above the frozen threshold, not on one below it."""
    runs = []
    for i, seed in enumerate(fifth_study.REPLICATION.seeds[:3]):
        runs += [_fake("local", seed, 0.3 + 0.01 * i, 0.45), _fake("pooled", seed, 0.6, 0.03)]
    for seed in fifth_study.LOW.seeds[:2]:
        runs += [_fake("local", seed, 0.5, 0.1), _fake("pooled", seed, 0.5, 0.02)]
    for run in runs:
        run["configuration"] = fifth_study.REPLICATION.name if run["seed"] < 650 else fifth_study.LOW.name
    summary = fifth_study.summarize(runs)
    replication = summary["configurations"][fifth_study.REPLICATION.name]
    assert replication["contrast"]["pairs"] == 3
    assert replication["warning_fired_on_local_runs"] == "3 of 3"
    assert replication["measured_local_drift"] == pytest.approx(0.45)
    assert summary["configurations"][fifth_study.LOW.name]["warning_fired_on_local_runs"] == "0 of 2"
    assert summary["primary"]["pairs"] == 13  # the fourth's ten and these three
    assert summary["primary"]["planned_pairs"] == 20
