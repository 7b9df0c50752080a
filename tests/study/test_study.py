"""The toy study: its plan, gate and analysis, a user's own env through the store, the pipeline at smoke size, the reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from redisync.study.fleet import ARMS, StudyConfig, run_arm
from redisync.study.learner import SAC, SACConfig
from redisync.study.study import PRIMARY, analyse, gate, load_env_factory, plan
from redisync.study.task import Step

from ..conftest import real_redis_or_skip


def test_the_plan_gives_every_primary_arm_its_seeds_and_pairs_everything():
    """The plan runs both arms of every primary contrast on the same seeds, and the comparison arm on its
    share of them."""
    cells = {(c, a): seeds for c, a, seeds in plan(8, 3)}
    for condition, a, b in PRIMARY:
        assert cells[(condition, a)] == cells[(condition, b)] == list(range(8))
    assert cells[("H", "weighted")] == [0, 1, 2]
    assert all(a in ARMS for _, a in cells)


def _runs(values: dict[tuple[str, str], list[float]]) -> list[dict]:
    return [
        {
            "condition": c,
            "arm": a,
            "seed": s,
            "summary": {
                "completion_auc": v,
                "final_completion": v,
                "skill_share": 0.1,
                "mean_drift_tv": 0.0,
                "mean_buffer_tv": 0.0,
            },
        }
        for (c, a), vs in values.items()
        for s, v in enumerate(vs)
    ]


def test_the_gate_and_the_analysis_follow_the_pre_registration():
    """The gate passes only on the pre-registered difference, and the analysis answers each hypothesis as the
    plan says it would."""
    rng = np.random.default_rng(3)
    assert not gate(_runs({("H", "single"): [0.5, 0.6, 0.55], ("H", "uniform"): [0.45, 0.5, 0.5]}))["passed"]
    passed = gate(_runs({("H", "single"): [0.9, 0.8, 0.85], ("H", "uniform"): [0.4, 0.5, 0.45]}))
    assert passed["passed"]
    assert passed["mean_difference"] == pytest.approx(0.4)
    base = list(0.6 + rng.normal(0, 0.01, 8))
    values = {
        ("H", "single"): [b + 0.3 for b in base],
        ("H", "uniform"): base,
        ("H", "local"): base,
        ("H", "pooled"): list(np.array(base) + np.tile([0.01, -0.01], 4)),
        ("X", "local"): [b + 0.2 for b in base],
        ("X", "pooled"): base,
        ("X", "broadcast"): list(np.array(base) + np.array([0.3, -0.25, 0.2, -0.35, 0.1, -0.05, 0.3, -0.2])),
    }
    primary = {c["name"]: c["verdict"] for c in analyse(_runs(values))["primary"]}
    assert primary == {
        "H: single − uniform": "higher",
        "H: local − pooled": "equivalent",
        "X: local − pooled": "higher",
        "X: broadcast − pooled": "inconclusive",
    }


# ---------------------------------------------------------------- the pipeline


class ConstantDriftEnv:
    """A user's own env, to show the interface suffices: a 1-D mass whose profile decides where it falls."""

    obs_dim, act_dim, step_dt = 3, 1, 0.02

    def __init__(self, profiles: torch.Tensor, seed: int):
        self.num_envs, self.num_frames = len(profiles), 4 * 50 - 1
        self.profiles = profiles
        self.frames = torch.zeros(self.num_envs, dtype=torch.long)
        self.x = torch.zeros(self.num_envs)
        self.g = torch.Generator().manual_seed(seed)

    def reset(self, env_ids, start_frames):
        self.frames[env_ids] = start_frames
        self.x[env_ids] = 0.0

    def observations(self):
        return torch.stack([self.x, self.frames.float() / self.num_frames, self.profiles.float()], 1)

    def step(self, actions):
        self.frames = (self.frames + 1).clamp(max=self.num_frames - 1)
        bin_ = self.frames * 4 // self.num_frames
        kick = (bin_ == self.profiles % 4).float() * torch.randn(self.num_envs, generator=self.g)
        self.x = self.x + 0.1 * actions[:, 0] + kick
        terminated = self.x.abs() > 1.0
        truncated = ~terminated & (self.frames >= self.num_frames - 1)
        return Step(self.observations(), torch.exp(-(self.x**2)), terminated, truncated)


def user_env_factory(task):
    return lambda profiles, seed: ConstantDriftEnv(profiles, seed)


TINY = replace(
    StudyConfig().smoke(),
    env_steps=3_000,
    learning_starts=1_000,
    eval_every=1_500,
    drift_every=1_000,
    envs_per_shard=16,
    sac=SACConfig(hidden=32, batch_size=128),
)


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_a_users_own_env_runs_through_the_store(backend):
    """A user's own env, named as module:function, trains through the store and its drift is measured, on
    either backend."""
    url = real_redis_or_skip() if backend == "real" else None
    cfg = replace(TINY, task=replace(TINY.task, bins=4))
    run = run_arm(
        cfg, "pooled", seed=0, url=url, make_env=load_env_factory("tests.study.test_study:user_env_factory", cfg)
    )
    assert len(run["curve"]) == 2
    assert 0.0 <= run["curve"][-1]["completion"] <= 1.0
    assert run["drift"]
    assert all(len(d["tv"]) == cfg.shards and d["buffer_tv"] is not None for d in run["drift"])


@pytest.mark.parametrize("arm", ["per-profile", "local-paper", "norm-local", "local-16-shards"])
def test_every_kind_of_arm_trains_on_x(arm):
    """Every arm of the study trains on condition X with its own number of shards, and samples the skill
    segments."""
    cfg = replace(TINY, task=replace(TINY.task, condition="X", obs_offset=1.0))
    run = run_arm(cfg, arm, seed=0)
    assert run["shards"] == (ARMS[arm].shards or cfg.shards)
    assert len(run["curve"]) == 2
    assert 0.0 < run["skill_share"] < 1.0


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_the_learner_reads_each_shards_drift_back_from_the_store(backend):
    """Two unsynced shards failing in different bins: each is far from the pooled distribution,
    their mixture (what the buffer gets) much closer."""
    import uuid

    import redisync
    from redisync.collector.workers import new_syncer
    from redisync.study.fleet import DriftProbe, fleet_drift
    from redisync.terms.torch import AdaptiveMotionSampler

    url = real_redis_or_skip() if backend == "real" else None
    store = redisync.connect(url, run=f"t-drift-{uuid.uuid4().hex[:8]}")
    try:
        for shard, hard_bin in ((0, 1), (1, 3)):
            sampler = AdaptiveMotionSampler(4 * 50 - 1, 0.02, mode="local", alpha=0.5)
            probe = DriftProbe(4, 4 * 50 - 1, 0.02, alpha=0.5, uniform_ratio=0.1)
            for term in (sampler, probe):
                term.record_failures(torch.full((10,), hard_bin * 50 + 5), torch.ones(10, dtype=torch.bool))
                term.step()
            probe.used = sampler.probabilities().double().numpy()
            syncer = new_syncer(redisync.connect(url, run=store.run), shard, [sampler, probe]).start()
            syncer.stop()  # flushes the reports
        drift = fleet_drift(store, 0.1)
        assert len(drift["tv"]) == 2
        assert min(drift["tv"]) > 0.3
        assert drift["buffer_tv"] < min(drift["tv"]) / 3
    finally:
        store.delete()


def test_a_wrong_env_spec_is_refused_naming_what_is_wrong():
    """An env spec that is not module:function, names a module that does not import, or a function it lacks,
    is refused saying which."""
    with pytest.raises(ValueError, match="module:function"):
        load_env_factory("tests.study.test_study", TINY)
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        load_env_factory("no_such_module:make", TINY)
    with pytest.raises(ValueError, match="has no 'no_such_factory'"):
        load_env_factory("tests.study.test_study:no_such_factory", TINY)
    out = subprocess.run(
        [sys.executable, "-m", "redisync.cli", "ab", "--env", "no_such_module:make", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "--env" in out.stderr
    assert "no_such_module" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.integration  # a pool of worker processes
def test_a_study_worker_that_dies_ends_the_study_with_the_error(tmp_path):
    """multiprocessing's Pool replaced a worker that died at start with another, endlessly (315
    tracebacks in 10 minutes on a loaded machine, and no end): the study now stops, saying why."""
    (tmp_path / "dies_in_workers.py").write_text(
        "import multiprocessing, os\n"
        "if multiprocessing.current_process().name != 'MainProcess':\n"
        "    os._exit(3)  # a worker process that cannot start\n"
        "from redisync.study.fleet import default_env as make  # the parent's check builds the built-in task\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "redisync.cli",
                "ab",
                "--smoke",
                "--stage",
                "gate",
                "--env",
                "dies_in_workers:make",
            ),
            *("--out", str(tmp_path / "out"), "--no-progress"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 1, out.stderr[-2000:]
    assert "a study worker process died before finishing its run" in out.stderr


@pytest.mark.slow
def test_the_smoke_gate_runs_end_to_end_and_the_report_leads_with_it(tmp_path):
    """CI's run of the gate in miniature through the command line: three paired seeds of `single`
    and `uniform` on H, the decision taken by the pre-registered threshold, the gate first in the report."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "redisync.cli",
            "ab",
            "--smoke",
            "--stage",
            "gate",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    results = json.loads((tmp_path / "results.json").read_text())
    g = results["gate"]
    assert g["seeds"] == 3
    assert g["passed"] == (g["mean_difference"] >= 0.2)
    # the exit status says the gate's decision: 0 passed, 1 failed (one line naming it), never a traceback
    assert out.returncode == (0 if g["passed"] else 1), out.stderr
    assert g["passed"] or ("the gate failed" in out.stderr and "Traceback" not in out.stderr)
    assert all(0.0 <= v <= 1.0 for v in g["single"] + g["uniform"])
    assert {r["seed"] for r in results["gate_runs"]} == {100, 101, 102}
    report = (tmp_path / "report.md").read_text()
    assert report.index("## The gate") < report.index("## Set-up")
    assert "redisync ab --smoke" in report
    assert f"{g['mean_difference']:+.3f}" in report
    assert "gate:" in out.stdout
    assert (tmp_path / "completion.png").read_bytes()[:4] == b"\x89PNG"


def test_the_report_claims_only_what_the_tests_say(tmp_path):
    """The rendered report states each hypothesis's answer as its test gave it; with a failed gate it says so
    and reports no contrast."""
    from redisync.study.report import render_markdown

    rng = np.random.default_rng(0)
    base = list(0.5 + rng.normal(0, 0.01, 8))
    values = {
        ("H", "single"): [b + 0.3 for b in base],
        ("H", "uniform"): base,
        ("H", "local"): base,
        ("H", "pooled"): list(np.array(base) + np.tile([0.01, -0.01], 4)),
        ("X", "local"): [b + 0.2 for b in base],
        ("X", "pooled"): base,
        ("X", "broadcast"): list(np.array(base) + np.array([0.3, -0.25, 0.2, -0.35, 0.1, -0.05, 0.3, -0.2])),
    }
    runs = _runs(values)
    for r in runs:
        r["curve"] = [{"env_steps": 1, "completion": r["summary"]["completion_auc"]}]
        r["wall_s"] = 60.0
    results = {
        "config": StudyConfig().to_dict(),
        "env": "test",
        "gate": gate(runs),
        "gate_runs": runs,
        "runs": runs,
        "analysis": analyse(runs),
        "workers": 2,
        "wall_s": 1800.0,
    }
    text = render_markdown(results, "redisync ab", [])
    assert "the gate **passed**" in text
    assert f"{2 * len(runs)} runs ({len(runs)} of them the gate), {2 * len(runs)} min of training on 2 workers" in text
    assert "30 min wall" in text
    assert "on H, `single` completes more of the motion than `uniform`" in text
    assert "on H, `local` and `pooled` are equivalent within ±0.1" in text
    assert "on X, `local` completes more of the motion than `pooled`" in text
    assert "on X, `broadcast` vs `pooled` is inconclusive at 8 seeds" in text
    failed = dict(
        results, gate=gate(_runs({("H", "single"): base[:3], ("H", "uniform"): base[:3]})), analysis=None, runs=[]
    )
    text = render_markdown(failed, "redisync ab", [])
    assert "the gate **FAILED**" in text
    assert "## Primary contrasts" not in text


@pytest.mark.slow
def test_the_whole_plan_runs_in_miniature_and_reports_every_contrast(tmp_path):
    """Past the gate: every (condition, arm) of the plan trains, pairs by seed and reaches the report."""
    from redisync.study.report import write_report
    from redisync.study.study import SECONDARY, run_cells

    runs = run_cells(TINY, plan(2, 2), url=None, env_spec=None, workers=2, show_progress=False, desc="test")
    assert {(r["condition"], r["arm"]) for r in runs} == {(c, a) for c, a, _ in plan(2, 2)}
    analysis = analyse(runs)
    assert len(analysis["primary"]) == len(PRIMARY)
    assert len(analysis["secondary"]) == len(SECONDARY)
    assert all(c["n"] == 2 and c["p_holm"] is not None for c in analysis["primary"])
    results = {
        "config": TINY.to_dict(),
        "env": "built-in",
        "gate": {**gate(runs), "passed": True},
        "gate_runs": runs,
        "runs": runs,
        "analysis": analysis,
    }
    text = (write_report(results, tmp_path, "redisync ab (test)")).read_text()
    assert "## Primary contrasts" in text
    assert "**H — identical shards.**" in text
    assert "**X — different shards.**" in text
    assert (tmp_path / "mechanism.png").read_bytes()[:4] == b"\x89PNG"


def test_the_committed_report_and_the_readme_follow_the_committed_results():
    """docs/ab/report.md is what its results.json renders to (led by the follow-up's answers once
    docs/ab/follow-up holds them), the study's page quotes it, and the README's one line."""
    from redisync.study.report import render_markdown, study_lead

    root = Path(__file__).resolve().parents[2]
    results = json.loads((root / "records" / "ab" / "results.json").read_text())
    report = (root / "docs" / "ab" / "report.md").read_text()
    lead = study_lead(root / "records" / "ab")
    assert render_markdown(results, results["command"], ["completion.png", "mechanism.png"], lead) == report
    for folder in ("follow-up", "second-follow-up"):  # each follow-up's report is what its results.json renders to
        held = json.loads((root / "records" / "ab" / folder / "results.json").read_text())
        assert (
            render_markdown(held, held["command"], ["completion.png"])
            == (root / "docs" / "ab" / folder / "report.md").read_text()
        )
    primary = {c["name"]: c for c in results["analysis"]["primary"]}
    secondary = {c["name"]: c for c in results["analysis"]["secondary"]}
    page = (root / "docs" / "study.md").read_text()
    summary = " ".join(page[page.index("# Does drift hurt training?") : page.index("## Bring your own env")].split())
    # in the order a reader asks: the question, the answers, how we know, then the history
    heads = ["## The question", "## What the studies answered", "## How we know", "## Earlier answers, newest first"]
    assert [page.index(h) for h in heads] == sorted(page.index(h) for h in heads)

    def interval(c):
        return f"{c['mean']:+.2f} [{c['lo']:+.2f}, {c['hi']:+.2f}]".replace("-", "−")

    def interval90(c):
        return f"{c['mean']:+.2f}, 90 % interval [{c['lo90']:+.2f}, {c['hi90']:+.2f}]".replace("-", "−")

    h, x = primary["H: local − pooled"], primary["X: local − pooled"]
    assert h["verdict"] == "inconclusive"
    assert h["p_equivalence"] < 0.05 < h["p_equivalence_holm"]
    assert interval90(h) in summary
    assert f"(p {h['p_equivalence_holm']:.2f})" in summary
    assert f"±{h['detectable']:.2f}" in summary
    assert interval90(secondary["X: per-profile − local"]) in summary
    assert x["verdict"] == "inconclusive"
    assert interval(x) in summary
    assert x["p_sign_flip"] < 0.05 < x["p_holm"]
    assert f"{primary['H: single − uniform']['mean']:+.2f}" in summary
    # the follow-up leads the summary, each hypothesis with its estimate and its 95 % t-interval from the
    # per-seed differences; only P1 is stated as a finding (P2's interval crosses zero: P3, P4 descriptive)
    from scipy import stats

    follow = json.loads((root / "records" / "ab" / "follow-up" / "results.json").read_text())["follow_up"]

    def t_interval(d):
        d = np.asarray(d)
        half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size)
        return d.mean() - half, d.mean() + half

    for h in follow:
        lo, hi = t_interval(h["differences"])
        assert f"{h['mean']:+.2f}".replace("-", "−")[1:] in summary, h["name"]
        assert f"[{lo:+.2f}, {hi:+.2f}]".replace("-", "−") in summary, h["name"]
    p1, p2 = follow[0], follow[1]
    assert t_interval(p1["differences"])[1] < 0  # P1 carries its claim ...
    assert f"p {p1['p_one_sided']:.3f}" in summary
    assert t_interval(p2["differences"])[0] < 0 < t_interval(p2["differences"])[1]  # ... P2's crosses zero
    assert "the harm is drift, not only" not in summary
    assert summary.count("descriptive") >= 2
    flattening = np.subtract(p1["differences"], p2["differences"])  # local − local-paper, paired by seed
    assert f"{flattening.mean():+.2f}".replace("-", "−") in summary
    assert all(flattening < 0)
    assert summary.index("pre-registered follow-up") < summary.index("The study of record")
    # the second follow-up's answers lead, each quoted only once its question was tested, with its interval
    second = json.loads((root / "records" / "ab" / "second-follow-up" / "results.json").read_text())
    a = next(r for r in second["second_follow_up"] if r["question"] == "A")
    readme_text = " ".join((root / "README.md").read_text().split())
    if "p_one_sided" in a:
        quoted = f"{a['mean']:+.2f}, 95 % t-interval [{a['lo']:+.2f}, {a['hi']:+.3f}]".replace("-", "−")
        quoted = quoted.replace("t−interval", "t-interval")
        assert quoted in summary
        assert f"over {len(a['seeds'])} seeds" in summary
        assert f"p {a['p_one_sided']:.3f}" in summary
        verdict = "on the toy task, drift hurt 64-env shards" in summary
        assert verdict == a["rejected"]  # the page says what the test decided, and only that
        assert f"{a['mean']:+.2f} (95 % interval [{a['lo']:+.2f}, {a['hi']:+.3f}]".replace("-", "−") in readme_text
    # B: each contrast's interval on the study page once tested, the verdicts as the test decided them,
    # and the broadcast-worse figure where the guides and the README quote it
    b = [r for r in second["second_follow_up"] if r["question"] == "B"]
    if all("verdict" in r for r in b):
        guides = {
            name: " ".join((root / "docs" / "guides" / name).read_text().split())
            for name in ("collector.md", "frameworks.md")
        }
        for r in b:
            shown = f"[{r['lo']:+.2f}, {r['hi']:+.2f}]".replace("-", "−")
            assert shown in summary, r["contrast"]
        worse = [r for r in b if r["verdict"] == "worse"]
        assert {r["contrast"][:3] for r in worse} == {"H: "}  # worse only on identical shards, as the page says
        assert all(r["verdict"] == "inconclusive" for r in b if r["contrast"].startswith("X: "))
        assert "On shards that run different env profiles neither is shown different" in summary
        h_broadcast = next(r for r in b if r["contrast"].startswith("H: broadcast"))
        figure = f"{h_broadcast['mean']:+.2f}".replace("-", "−")
        interval = f"[{h_broadcast['lo']:+.2f}, {h_broadcast['hi']:+.2f}]".replace("-", "−")
        for text in (*guides.values(), readme_text):
            assert figure in text
            assert interval in text
    # C: once all its runs are in, the 128-env answer with its interval, the 64- and 256-env ones beside
    # it, the verdict as the test decided it, and what the plan said the warning check then means
    c = [r for r in second["second_follow_up"] if r["question"] == "C"]
    if all(r["complete"] for r in c):
        tested, *beside = c

        def interval(r):
            return f"[{r['lo']:+.2f}, {r['hi']:+.2f}]".replace("-", "−")

        quoted = f"{tested['mean']:+.2f}, 95 % t-interval {interval(tested)}".replace("-", "−")
        assert quoted.replace("t−interval", "t-interval") in summary
        assert f"p {tested['p_one_sided']:.3f}" in summary
        assert all(interval(r) in summary for r in beside)
        assert ("unsynced 128-env shards did worse too" in summary) == tested["rejected"]
        assert ("its thresholds stand" in summary) == tested["rejected"]  # it fires at 128 (test_numpy_terms)
        assert ("fires earlier than harm was shown" in summary) == (not tested["rejected"])
        assert f"{tested['mean']:+.2f} (95 % interval {interval(tested)}".replace("-", "−") in readme_text
        assert "still running" not in summary
    assert summary.index("second pre-registered follow-up") < summary.index("first pre-registered follow-up")
    assert f"{results['gate']['mean_difference']:+.3f}" in " ".join(page.split())
    # the README's one line quotes the first hypothesis: its estimate and its seeds, all of one sign
    readme = " ".join((root / "README.md").read_text().split())
    assert f"{p1['mean']:.2f} in completion AUC".replace("-", "−") in readme
    assert all(d < 0 for d in p1["differences"])
    assert f"{len(p1['differences'])} of {len(p1['differences'])} seeds" in readme


def test_a_failed_gate_exits_nonzero_and_the_default_out_is_a_scratch_folder(monkeypatch, tmp_path):
    """``redisync ab`` with a gate that fails: exit status 1, one line naming it; the report goes to
    out/ab (not the committed docs/ab) unless --out says otherwise."""
    import redisync.study.report as report_module
    import redisync.study.study as study_module
    from redisync import cli

    gate = {"passed": False, "mean_difference": 0.05, "threshold": 0.2}
    monkeypatch.setattr(study_module, "run_study", lambda *a, **k: {"gate": gate, "analysis": None})
    written = []
    monkeypatch.setattr(
        report_module,
        "write_report",
        lambda results, out, command, pages=None: written.append(out) or out / "report.md",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["redisync", "ab", "--smoke", "--stage", "gate", "--no-progress"])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 1
    assert written == [Path("out/ab")]


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_one_arm_and_one_seed_run_twice_give_the_same_numbers(backend):
    """The shards sync at fixed points of the step count, not on timers: the same arm and seed give
    the same completion curve, drift and skill share, however loaded the machine (the runs used to
    differ: H/pooled seed 0 gave AUC 0.524 and 0.495)."""
    url = real_redis_or_skip() if backend == "real" else None
    cfg = replace(TINY, publish_every_steps=2)
    first, second = (run_arm(cfg, "pooled", seed=1, url=url) for _ in range(2))
    assert first["curve"] == second["curve"]
    assert first["drift"] == second["drift"]
    assert first["skill_share"] == second["skill_share"]
    assert any(d["tv"] and max(d["tv"]) > 0 for d in first["drift"])  # the shards did differ, and synced


def test_seeds_are_different_motions():
    """Each seed draws a different motion of the same kind (the same number of skill segments)."""
    from redisync.study.study import seeded

    layouts = [seeded(StudyConfig(), seed).task.layout() for seed in range(4)]
    assert len({tuple(x.flatten().tolist()) for x in layouts}) == 4
    assert all(int((x > 0).sum()) == StudyConfig().task.skill_segments for x in layouts)  # the same kind of motion


def test_the_drift_reference_uses_the_arms_own_mix():
    """A shard sampling exactly its fleet's EMA under the paper's uniform mix has no drift; measured
    against the code mix (as every arm used to be) it looked drifted."""
    import uuid

    import redisync
    from redisync.collector.workers import new_syncer
    from redisync.study.fleet import DriftProbe, fleet_drift
    from redisync.terms.torch import AdaptiveMotionSampler

    store = redisync.connect(None, run=f"t-mix-{uuid.uuid4().hex[:8]}")
    try:
        sampler = AdaptiveMotionSampler(4 * 50 - 1, 0.02, mode="local", alpha=0.5, uniform_mix="paper")
        probe = DriftProbe(4, 4 * 50 - 1, 0.02, alpha=0.5, uniform_ratio=sampler.uniform_ratio)
        for term in (sampler, probe):
            term.record_failures(torch.full((10,), 2 * 50 + 5), torch.ones(10, dtype=torch.bool))
            term.step()
        probe.used = sampler.probabilities().double().numpy()
        new_syncer(redisync.connect(None, run=store.run), 0, [sampler, probe]).start().stop()
        assert fleet_drift(store, sampler.uniform_ratio, "paper")["tv"][0] < 1e-6
        assert fleet_drift(store, sampler.uniform_ratio, "code")["tv"][0] > 0.05
    finally:
        store.delete()


def test_the_evaluation_normalises_each_profile_as_its_collectors_do():
    """norm-local: each shard's normaliser sees only its own profile's observations (an offset per
    profile); the evaluated policy must see them through those, not through the learner's."""
    import uuid

    from redisync.study.fleet import as_collectors_act, default_env, make_collector

    cfg = replace(TINY, task=replace(TINY.task, condition="X", obs_offset=1.0))
    arm, run = ARMS["norm-local"], f"t-eval-{uuid.uuid4().hex[:8]}"
    make_env = default_env(cfg.task)
    fleet = [make_collector(cfg, arm, s, cfg.shards, cfg.envs_per_shard, 0, None, run, make_env) for s in range(2)]
    learner = SAC(fleet[0].env.obs_dim, fleet[0].env.act_dim, cfg.sac)
    for _ in range(5):
        for c in fleet:
            c.step(None, learner)
    profiles = torch.tensor([0, 1, 0, 1])
    obs = torch.randn(4, fleet[0].env.obs_dim)
    got = as_collectors_act(learner.actor, fleet, profiles)(obs)
    for p, c in enumerate(fleet):  # shard p runs profile p
        want = learner.actor(c.normalizer(obs[profiles == p]), deterministic=True)[0]
        assert torch.equal(got[profiles == p], want)
    mean0, mean1 = (c.normalizer.mean.clone() for c in fleet)
    assert not torch.allclose(mean0, mean1)  # the shards' statistics do differ


@pytest.mark.slow
def test_the_follow_up_runs_in_miniature_and_its_report_leads_with_the_answers(tmp_path):
    """Past the gate: every (condition, arm, seed) of the follow-up trains on the tiny configuration,
    the hypotheses are answered in sequence, and the report leads with them."""
    from redisync.study.plans import toy_dose_mechanism as follow_up
    from redisync.study.report import write_report
    from redisync.study.study import run_cells

    runs = run_cells(TINY, follow_up.cells(), url=None, env_spec=None, workers=2, show_progress=False, desc="test")
    answers = follow_up.analyse(runs)
    assert [h["name"] for h in answers] == ["P1", "P2", "P3", "P4"]
    assert answers[0]["tested"]
    assert [len(h["seeds"]) for h in answers] == [h.seeds for h in follow_up.HYPOTHESES]
    results = {
        "config": TINY.to_dict(),
        "env": "built-in",
        "gate": {**gate(runs), "passed": True},
        "gate_runs": [],
        "runs": runs,
        "analysis": None,
        "follow_up": answers,
    }
    report = write_report(results, tmp_path / "follow-up", "redisync ab --follow-up (test)").read_text()
    assert report.index("follow-up's pre-registered answers") < report.index("## Set-up")
    study = {**results, "follow_up": None, "analysis": None}  # the study of record beside it: led by the answers
    led = write_report(study, tmp_path, "redisync ab (test)").read_text()
    assert led.index("The pre-registered follow-up's answers") < led.index("## The gate")
    assert "16d6584" in led


@pytest.mark.slow
def test_a_study_with_saved_runs_resumes_and_refuses_another_configuration(tmp_path, monkeypatch):
    """Each finished run is kept at once; a rerun returns the saved ones as saved and trains only
    what is missing; a saved run of another configuration is refused, naming the file."""
    from redisync import errors
    from redisync.study import study

    cells = [("H", "local", [1, 2]), ("H", "pooled", [1])]
    runs = study.run_cells(
        TINY, cells, url=None, env_spec=None, workers=2, show_progress=False, desc="t", saved=tmp_path
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["H-local-1.json", "H-local-2.json", "H-pooled-1.json"]

    saved = json.loads((tmp_path / "H-local-1.json").read_text())  # marked: a rerun must return it as saved
    saved["run"]["summary"]["completion_auc"] = 42.0
    (tmp_path / "H-local-1.json").write_text(json.dumps(saved))
    again = study.run_cells(TINY, cells, url=None, env_spec=None, workers=1, show_progress=False, desc="t",
                            saved=tmp_path)  # fmt: skip
    held = {(r["arm"], r["seed"]): r["summary"]["completion_auc"] for r in again}
    assert held == {(r["arm"], r["seed"]): r["summary"]["completion_auc"] for r in runs} | {("local", 1): 42.0}
    (tmp_path / "H-pooled-1.json").unlink()
    more = study.run_cells(
        TINY, cells, url=None, env_spec=None, workers=1, show_progress=False, desc="t", saved=tmp_path
    )
    assert len(more) == 3
    assert (tmp_path / "H-pooled-1.json").is_file()
    with pytest.raises(errors.RedisyncError, match=r"H-local-1\.json was trained with another configuration"):
        study.run_cells(replace(TINY, env_steps=4_000), cells, url=None, env_spec=None, workers=1,
                        show_progress=False, desc="t", saved=tmp_path)  # fmt: skip


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"run": {"arm": "local"}}'])
def test_a_damaged_saved_run_is_a_typed_error_naming_its_file(tmp_path, text):
    """Resuming and rendering from saved runs both refuse a file that is not a saved run, saying
    which (a report rendered from runs must never stop on a traceback, or skip one silently)."""
    from redisync import errors
    from redisync.study import study
    from redisync.study.plans import toy_mechanism_semantics

    (tmp_path / "H-local-1.json").write_text(text)
    with pytest.raises(errors.RedisyncError, match=r"H-local-1\.json: not a saved run"):
        study.run_cells(TINY, [("H", "local", [1])], url=None, env_spec=None, workers=1, show_progress=False,
                        desc="t", saved=tmp_path)  # fmt: skip
    with pytest.raises(errors.RedisyncError, match=r"H-local-1\.json: not a saved run"):
        toy_mechanism_semantics.saved_results(
            tmp_path, TINY, "redisync ab --plan toy-mechanism-semantics --report-only"
        )
