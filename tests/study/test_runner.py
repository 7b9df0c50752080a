"""The one runner of a plan's stages: runs kept as they finish, the summary rewritten after each stage."""

from __future__ import annotations

import json

import pytest

from redisync.study.fleet import StudyConfig
from redisync.study.runner import Stage, run_stages


@pytest.fixture
def ran(monkeypatch):
    """``run_cells`` without training: each cell's runs as the runner asks for them, in order."""
    calls = []

    def run_cells(cfg, cells, *, url, env_spec, workers, show_progress, desc, saved):
        calls.append({"cells": cells, "desc": desc, "saved": saved, "env": env_spec})
        return [{"arm": arm, "seed": seed, "x": seed} for _, arm, seeds in cells for seed in seeds]

    monkeypatch.setattr("redisync.study.study.run_cells", run_cells)
    return calls


def test_each_stage_runs_in_order_and_the_summary_of_the_runs_so_far_follows_it(ran, tmp_path):
    """Stages run in order, into ``saved``; after each the summary file holds the runs so far."""
    seen = []

    def summarize(runs):
        seen.append(len(runs))
        return {"runs": len(runs), "seeds": sorted(r["seed"] for r in runs)}

    said = []
    stages = [Stage("first", [("H", "a", [1, 2])], "bar one"), Stage("second", [("H", "b", [3]), ("H", "c", [4])])]
    out = run_stages(
        StudyConfig(), "env:make", stages, summarize, saved=tmp_path / "runs", summary_path=tmp_path / "s.json",
        workers=1, on_stage=said.append,
    )  # fmt: skip
    assert said == ["first", "second"]
    assert [c["desc"] for c in ran] == ["bar one", "second"]  # the progress bar's name, else the label
    assert {c["saved"] for c in ran} == {tmp_path / "runs"}
    assert {c["env"] for c in ran} == {"env:make"}
    assert seen == [2, 4]
    assert out == {"runs": 4, "seeds": [1, 2, 3, 4]}
    assert json.loads((tmp_path / "s.json").read_text()) == out


def test_a_plan_stops_after_the_stage_whose_summary_says_why(ran, tmp_path):
    """``stop`` ends the plan after a stage (the reason said); later stages never run."""
    said = []
    stages = [Stage(f"stage {k}", [("H", "a", [k])]) for k in range(3)]
    out = run_stages(
        StudyConfig(), "env:make", stages, lambda runs: {"n": len(runs)}, saved=tmp_path, summary_path=tmp_path / "s.json",
        workers=1, on_stage=said.append, stop=lambda s: "enough" if s["n"] >= 2 else None,
    )  # fmt: skip
    assert said == ["stage 0", "stage 1", "enough"]
    assert len(ran) == 2
    assert out == {"n": 2}


def test_the_fourth_studys_gate_is_its_plan_run_by_the_runner(monkeypatch, tmp_path):
    """``run_gate`` runs the plan's arms on the plan's gate seeds, in its order, and writes gate.json."""
    from redisync.study import fourth_study as plan

    calls = []

    def run_cells(cfg, cells, *, url, env_spec, workers, show_progress, desc, saved):
        calls.append((cells, desc, saved, env_spec, cfg))
        return [
            {"arm": arm, "seed": s, "summary": {plan.PRIMARY_METRIC: 0.5 if arm == "single" else 0.2}}
            for _, arm, seeds in cells
            for s in seeds
        ]

    monkeypatch.setattr("redisync.study.study.run_cells", run_cells)
    summary = plan.run_gate(tmp_path, workers=1)
    assert [c[0] for c in calls] == [[("H", arm, list(plan.GATE_SEEDS))] for arm in ("single", "uniform")]
    assert [c[1] for c in calls] == ["gate single", "gate uniform"]
    assert {c[2] for c in calls} == {tmp_path / "gate"}
    assert {c[3] for c in calls} == {plan.ENV}
    assert all(c[4] is plan.CONFIG for c in calls)
    assert summary["passed"] is True
    assert json.loads((tmp_path / "gate.json").read_text())["passed"] is True
