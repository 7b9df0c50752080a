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
        calls.append({"cells": cells, "desc": desc, "saved": saved, "env": env_spec, "cfg": cfg})
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
    from redisync.study.plans import walker_contrast as plan

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


@pytest.mark.parametrize(
    ("name", "key", "resumable"),
    [("study", "analysis", False), ("follow-up", "follow_up", False), ("second follow-up", "second_follow_up", True)],
)
def test_a_toy_study_runs_its_gate_then_the_plan_chosen_as_data(monkeypatch, tmp_path, name, key, resumable):
    """The gate first; once it passes, the chosen plan's cells, progress name and judgement (the toy
    studies' plans as `PlanAfterGate` data), its runs kept only where that plan keeps them."""
    from redisync.study import study as toy
    from redisync.study.plans import toy_dose_mechanism as follow_up
    from redisync.study.plans import toy_mechanism_semantics as second_follow_up

    calls = []

    def run_cells(cfg, cells, *, url, env_spec, workers, show_progress, desc, saved=None):
        calls.append((desc, [tuple(c[:2]) for c in cells], saved))
        auc = {"single": 0.9, "uniform": 0.1}
        return [
            {"condition": c, "arm": arm, "seed": s, "summary": {toy.PRIMARY_METRIC: auc.get(arm, 0.5)}}
            for c, arm, seeds in cells
            for s in seeds
        ]

    monkeypatch.setattr(toy, "run_cells", run_cells)
    judged = []
    for module, attr in ((toy, "analyse"), (follow_up, "analyse"), (second_follow_up, "analyse")):
        monkeypatch.setattr(
            module, attr, lambda runs, module=module: judged.append(module.__name__) or {"n": len(runs)}
        )
    said = []
    after_gate = {"study": None, "follow-up": follow_up.after_gate, "second follow-up": second_follow_up.after_gate}[
        name
    ]
    result = toy.run_study(
        StudyConfig(),
        workers=1,
        show_progress=False,
        saved=tmp_path,
        on_stage=said.append,
        after_gate=after_gate() if after_gate else None,
    )
    assert calls[0] == ("gate", [("H", "single"), ("H", "uniform")], tmp_path)
    assert result["gate"]["passed"]
    desc, cells, saved = calls[1]
    assert desc == name
    assert said[1].startswith(f"{name}: ")
    assert saved == (tmp_path if resumable else None)
    want = {
        "study": toy.plan(8, 4),
        "follow-up": follow_up.cells(),
        "second follow-up": second_follow_up.order(second_follow_up.arms_needed()),
    }[name]
    assert cells == [tuple(c[:2]) for c in want]
    assert result[key] == {"n": len(result["runs"])}
    assert len(judged) == 1


def test_a_stage_runs_with_its_own_configuration_folder_and_tag(ran, tmp_path):
    """A stage's own configuration and folder (under ``saved``) are what its runs get; its tag marks
    each of its runs before the summary reads them."""
    own = StudyConfig(sampler_alpha=0.5)
    stages = [
        Stage("plain", [("H", "a", [1])]),
        Stage("own", [("H", "b", [2])], config=own, folder="b", tag=lambda run: run.update(stage="own")),
    ]
    out = run_stages(
        StudyConfig(), "env:make", stages, lambda runs: {"tags": [r.get("stage") for r in runs]},
        saved=tmp_path, summary_path=tmp_path / "s.json", workers=1,
    )  # fmt: skip
    assert [c["saved"] for c in ran] == [tmp_path, tmp_path / "b"]
    assert [c["cfg"] for c in ran] == [StudyConfig(), own]
    assert out == {"tags": [None, "own"]}


def test_load_only_trains_nothing_and_summarises_the_runs_kept(ran, tmp_path):
    """``load_only``: each stage's kept runs (in its folder, with its configuration) are the runs; the
    ones not yet run are absent; nothing is trained."""
    from redisync.study.study import condition_config, save_run

    own = StudyConfig(sampler_alpha=0.5)
    run = {"condition": "H", "arm": "b", "seed": 2, "summary": {"x": 1.0}}
    save_run(tmp_path / "b", condition_config(own, "H"), run)
    stages = [Stage("plain", [("H", "a", [1])]), Stage("own", [("H", "b", [2, 3])], config=own, folder="b")]
    out = run_stages(
        StudyConfig(), "env:make", stages, lambda runs: {"kept": [(r["arm"], r["seed"]) for r in runs]},
        saved=tmp_path, summary_path=tmp_path / "s.json", workers=1, load_only=True,
    )  # fmt: skip
    assert ran == []
    assert out == {"kept": [("b", 2)]}
