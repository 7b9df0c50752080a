"""The third pre-registered study: its plan and its code say the same, its tests decide as planned,
and its pipeline runs, resumes and reports from the saved runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.extras("torch", "scipy", "mujoco", "gymnasium")

PLAN = Path(__file__).resolve().parents[2] / "docs" / "ab" / "third-study-plan.md"


def _run(arm: str, alpha: float, seed: int, auc: float) -> dict:
    return {"arm": arm, "seed": seed, "third_arm": f"{arm}-a{alpha}", "summary": {"completion_auc": auc}, "drift": []}


def test_the_plan_states_the_codes_seeds_arms_rates_and_power():
    """The third study's committed plan states the code's seeds, arms, rates and power as the code has them."""
    from redisync.study.plans import walker_ema_window as t

    text = " ".join(PLAN.read_text().split())
    assert f"fresh seeds **{t.GATE_SEEDS[0]}\u2013{t.GATE_SEEDS[-1]}**" in text
    assert f"fresh seeds **{t.SEEDS[0]}\u2013{t.SEEDS[-1]}** ({len(t.SEEDS)})" in text
    assert all(f"α = {a}" in text for a in t.ALPHAS)
    assert f"{t.CONFIG.shards} shards × {t.CONFIG.envs_per_shard} envs" in text
    assert f"{t.CONFIG.env_steps:,}".replace(",", " ") + " env steps" in text
    low, high = (t.detectable(sd) for sd in (0.063, 0.102))
    assert f"about {low:.3f} to {high:.3f} AUC" in text
    for name in ("P1", "P2"):
        for decision in t.DECISIONS[name]:
            assert decision in text, decision


def test_p1_and_p2_are_decided_as_planned_with_ties_and_holm():
    """Harm at α = 0.001 smaller than at α = 0.01: P1 (harm < 0) and P2 (the interaction > 0) shown;
    a difference within the tie margin counts as zero in the sign-flip test."""
    from redisync.study.plans import walker_ema_window as t

    rng = np.random.default_rng(0)
    runs = []
    for seed in t.SEEDS:
        base = rng.uniform(0.4, 0.6)
        runs += [_run("pooled", 0.001, seed, base), _run("local", 0.001, seed, base - 0.05)]
        runs += [_run("pooled", 0.01, seed, base), _run("local", 0.01, seed, base - 0.2)]
    out = t.analyse(runs, tie=0.006)
    assert out["complete"]
    assert out["P1"]["mean"] == pytest.approx(-0.05)
    assert out["P2"]["mean"] == pytest.approx(0.15)
    assert out["P1"]["shown"]
    assert out["P2"]["shown"]
    assert out["P1"]["decision"] == t.DECISIONS["P1"][0]
    # every P1 difference within the tie margin: nothing shown, whatever their sign
    tied = t.analyse(runs, tie=0.06)
    assert tied["P1"]["ties"] == len(t.SEEDS)
    assert not tied["P1"]["shown"]
    assert tied["P1"]["decision"] == t.DECISIONS["P1"][1]
    # an incomplete study tests nothing yet
    partial = t.analyse([r for r in runs if r["seed"] != t.SEEDS[-1]], tie=0.006)
    assert not partial["complete"]
    assert "p_holm" not in partial["P1"]
    assert "running" in t.render({"plan": "p", "env": "e", "runs_done": 1, "runs_planned": 46, "gate": {
        "passed": True, "seeds": 3, "mean_difference": 0.3, "differences": [0.3] * 3}, "tie": 0.006,
        "analysis": partial})  # fmt: skip


@pytest.mark.slow
def test_the_pipeline_runs_resumes_and_reports_from_its_saved_runs(tmp_path, monkeypatch):
    """A tiny version of the study (2 gate seeds, 2 seeds per arm, a short motion) on the walker: every
    run saved with its provenance, a second call trains nothing, --report-only renders the same."""
    from redisync.study import study
    from redisync.study.plans import walker_ema_window as t

    from .tiny import tiny

    small = tiny(t.CONFIG, env_steps=1_024, envs_per_shard=8, bins=4, hidden=16, batch_size=32)
    monkeypatch.setattr(t, "CONFIG", small)
    monkeypatch.setattr(t, "GATE_SEEDS", (1, 2))
    monkeypatch.setattr(t, "SEEDS", (3, 4))
    real_gate = study.gate
    monkeypatch.setattr(study, "gate", lambda runs: real_gate(runs) | {"passed": True})  # a tiny run learns nothing
    result = t.run_third_study(tmp_path, workers=1)
    assert result["runs_done"] == result["runs_planned"] == 2 * 2 + 4 * 2
    files = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "runs").rglob("*.json"))
    assert len(files) == 12
    held = json.loads((tmp_path / "runs" / "alpha-0.001" / "H-local-3.json").read_text())
    assert held["config"]["sampler_alpha"] == 0.001
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", held["provenance"]["commit"])
    assert {"P1", "P2", "warning_against_harm"} <= set(result["analysis"])
    report = (tmp_path / "report.md").read_text()
    again = t.run_third_study(tmp_path, workers=1)  # resumed: everything saved, nothing trained
    assert again["analysis"]["P1"]["differences"] == result["analysis"]["P1"]["differences"]
    only = t.run_third_study(tmp_path, workers=1, report_only=True)
    assert only["analysis"]["P1"]["differences"] == result["analysis"]["P1"]["differences"]
    assert (tmp_path / "report.md").read_text() == report


def test_the_study_page_quotes_the_third_studys_committed_results():
    """Whatever the committed results of the third study hold, the study page says it and only that:
    the gate's figures once it is complete (and, if it failed, that nothing else ran); P1 and P2 with
    their intervals once the study is complete."""
    root = Path(__file__).resolve().parents[2]
    path = root / "records" / "ab" / "third-study" / "results.json"
    page = " ".join((root / "docs" / "study.md").read_text().split())
    if not path.is_file():
        assert "a third pre-registered study is running" in page
        return
    results = json.loads(path.read_text())
    gate = results["gate"]
    if gate is None or gate["seeds"] < 3:
        assert "a third pre-registered study is running" in page
        return
    mean = f"{gate['mean_difference']:+.3f}".replace("-", "−")
    assert mean in page
    singles = ", ".join(f"{v:.3f}" for v in gate["single"])
    assert singles in page
    if not gate["passed"]:
        paragraph = next(p for p in (root / "docs" / "study.md").read_text().split("\n\n") if "gate failed" in p)
        paragraph = " ".join(paragraph.split())
        assert "Its gate failed" in paragraph
        assert "no contrast was run" in paragraph
        assert mean in paragraph
        assert singles in paragraph
        assert "P1" not in paragraph  # nothing claimed beyond the gate
    else:
        analysis = results.get("analysis") or {}
        for name in ("P1", "P2"):
            row = analysis.get(name)
            if row and "p_holm" in row:
                interval = f"[{row['lo']:+.3f}, {row['hi']:+.3f}]".replace("-", "−")
                assert interval in page, name


@pytest.mark.parametrize("gate_passes", [True, False])
def test_the_third_study_runs_its_gate_then_each_rates_arms_and_reports(monkeypatch, tmp_path, gate_passes):
    """The gate (single vs uniform at α = 0.001, kept in runs/gate), then, only if it passes, local and
    pooled at each α in its own folder and configuration, α = 0.001 first; results.json and report.md
    from the runs; ``report_only`` trains nothing (run_cells faked: the plan's order, not its training)."""
    from redisync.study.plans import walker_ema_window as t

    calls = []
    auc = {"single": 0.9 if gate_passes else 0.1, "uniform": 0.5, "local": 0.4, "pooled": 0.6}

    def run_cells(cfg, cells, *, url, env_spec, workers, show_progress, desc, saved):
        calls.append((desc, [(c, arm, list(seeds)) for c, arm, seeds in cells], saved, cfg.sampler_alpha, env_spec))
        return [
            {"condition": c, "arm": arm, "seed": s, "summary": {"completion_auc": auc[arm]}, "drift": []}
            for c, arm, seeds in cells
            for s in seeds
        ]

    monkeypatch.setattr("redisync.study.study.run_cells", run_cells)
    monkeypatch.setattr(t, "tie_from_gate", lambda runs: 0.004)
    result = t.run_third_study(tmp_path, workers=1)
    gate = (
        "gate",
        [("H", "single", list(t.GATE_SEEDS)), ("H", "uniform", list(t.GATE_SEEDS))],
        tmp_path / "runs" / "gate",
    )
    arms = [
        (f"α={a}", [("H", "local", list(t.SEEDS)), ("H", "pooled", list(t.SEEDS))], tmp_path / "runs" / f"alpha-{a}")
        for a in t.ALPHAS
    ]
    assert [c[:3] for c in calls] == ([gate, *arms] if gate_passes else [gate])
    assert [c[3] for c in calls] == ([0.001, *t.ALPHAS] if gate_passes else [0.001])
    assert {c[4] for c in calls} == {t.ENV}
    assert result["gate"]["passed"] is gate_passes
    assert result["runs_planned"] == 2 * len(t.GATE_SEEDS) + 4 * len(t.SEEDS)
    if gate_passes:
        assert result["runs_done"] == result["runs_planned"]
        assert result["tie"] == 0.004
        assert result["analysis"]["P1"]["differences"] == pytest.approx([-0.2] * len(t.SEEDS))
    else:
        assert result["runs_done"] == 2 * len(t.GATE_SEEDS)
        assert "analysis" not in result
    assert json.loads((tmp_path / "results.json").read_text()) == json.loads(json.dumps(result, default=float))
    assert (tmp_path / "report.md").read_text() == t.render(result)
    calls.clear()
    t.run_third_study(tmp_path, workers=1, report_only=True)
    assert calls == []
