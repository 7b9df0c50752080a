"""The fourth study's pieces: the oracle's starts, the skill-segment endpoint, the pilots' summary."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.extras("torch", "scipy")


def _collector(arm_name: str, seed: int = 3):
    from redisync.study.fleet import ARMS, StudyConfig, default_env, make_collector
    from redisync.study.task import TaskConfig

    cfg = StudyConfig(task=TaskConfig(bins=30, skill_segments=2, seed=seed))
    return make_collector(cfg, ARMS[arm_name], 0, 1, 64, seed, None, f"t-oracle-{seed}", default_env(cfg.task))


def test_an_oracles_starts_lie_in_the_second_before_a_skill_segment():
    """Three quarters of an oracle's starts fall in the second before one of the profile's skill segments."""
    c = _collector("oracle")
    skill = c.env.skill_bins[0]
    per_bin = c.env.num_frames / skill.shape[0]
    starts = c.oracle_starts(4000)
    before = torch.zeros(len(starts), dtype=torch.bool)
    for b in skill.nonzero().squeeze(1).tolist():
        first = int(b * per_bin)
        before |= (starts >= first - 50) & (starts < first)
    share = float(before.float().mean())
    assert 0.72 < share < 0.80, share  # 0.75 by construction, plus the uniform part's few (2/30 of 0.25)


def test_skill_success_counts_rollouts_that_reach_a_segments_end():
    """On a task that cannot fail every rollout reaches its segment's end; a point mass that never
    pushes, on the real tolerance, reaches none."""
    from redisync.study.evaluation import Evaluation
    from redisync.study.task import SkillTracking, TaskConfig

    task = TaskConfig(bins=30, skill_segments=2, seed=5)
    ev = Evaluation(lambda profiles, seed: SkillTracking(task, profiles, seed), 1, 3, skill=True)

    def still(profiles):
        return lambda obs: torch.zeros(obs.shape[0], 2)

    row = ev.run(still)
    assert row["skill_success"] == 0.0  # it leaves the curve within the second before the segment
    lenient = TaskConfig(bins=30, skill_segments=2, seed=5, tolerance=1e9)
    ev = Evaluation(lambda profiles, seed: SkillTracking(lenient, profiles, seed), 1, 3, skill=True)
    assert ev.run(still)["skill_success"] == 1.0


def test_the_pilots_summary_gives_the_paired_sd_of_local_minus_pooled():
    """The paired sd is the sample sd of local − pooled skill success over the seeds both ran."""
    from redisync.study.plans.walker_contrast import pilot_summary

    def run(arm, seed, v):
        return {"arm": arm, "seed": seed, "summary": {"skill_success_auc": v, "final_skill_success": v,
                                                      "completion_auc": 0.1, "skill_share": 0.05}}  # fmt: skip

    runs = [run("local", 1, 0.4), run("pooled", 1, 0.5), run("local", 2, 0.3), run("pooled", 2, 0.6)]
    out = pilot_summary(runs)
    assert out["paired_sd"]["differences"] == pytest.approx([-0.1, -0.3])
    assert math.isclose(out["paired_sd"]["sd"], torch.tensor([-0.1, -0.3]).std().item(), rel_tol=1e-6)


def test_the_learnability_pilot_is_judged_as_planned_and_pilot_1_reported_from_its_files():
    """learnable(): the oracle's final skill success >= 0.75 on each pilot seed; pilot 1's committed
    runs fail it, and the pilots page quotes their figures."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import LEARNABILITY_SEEDS, learnable

    def summary(values):
        return {
            "arms": {"oracle": {s: {"final_skill_success": v} for s, v in zip(LEARNABILITY_SEEDS, values, strict=True)}}
        }

    assert learnable(summary([0.75, 1.0])) is True
    assert learnable(summary([0.5, 1.0])) is False
    assert learnable({"arms": {}}) is None
    root = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    page = (root.parents[2] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text()
    for seed in LEARNABILITY_SEEDS:
        run = json.loads((root / "pilot-1" / f"H-oracle-{seed}.json").read_text())
        final = run["run"]["curve"][-1]["skill_success"]
        auc = sum(c["completion"] for c in run["run"]["curve"]) / len(run["run"]["curve"])
        assert f"| oracle | {seed} | {final:.2f} | {auc:.3f} |" in page
        assert final < 0.75
        assert run["provenance"]["commit"].startswith("306bc6d")


def test_pilot_2_is_reported_from_its_files():
    """The pilots page quotes pilot 2's committed runs, which fail the learnability criterion."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import LEARNABILITY_SEEDS, LEARNABLE_SUCCESS

    root = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    page = (root.parents[2] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text()
    assert json.loads((root / "pilot-2.json").read_text())["learnable"] is False
    for seed in LEARNABILITY_SEEDS:
        run = json.loads((root / "pilot-2" / f"H-oracle-{seed}.json").read_text())
        curve = run["run"]["curve"]
        final, auc = curve[-1]["skill_success"], sum(c["completion"] for c in curve) / len(curve)
        assert f"| oracle | {seed} | {final:.2f} | {auc:.3f} |" in page
        assert final < LEARNABLE_SUCCESS


def test_pilot_3s_learnability_is_reported_from_its_files():
    """Pilot 3's oracle runs pass the learnability criterion, and the pilots page quotes them."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import LEARNABILITY_SEEDS, LEARNABLE_SUCCESS

    root = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    page = (root.parents[2] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text()
    assert json.loads((root / "pilot-3.json").read_text())["learnable"] is True
    for seed in LEARNABILITY_SEEDS:
        curve = json.loads((root / "pilot-3" / f"H-oracle-{seed}.json").read_text())["run"]["curve"]
        final, auc = curve[-1]["skill_success"], sum(c["completion"] for c in curve) / len(curve)
        assert f"| oracle | {seed} | {final:.2f} | {auc:.3f} |" in page
        assert final >= LEARNABLE_SUCCESS


def test_pilot_3s_table_is_its_run_files():
    """Every row of pilot 3's table on the pilots page is its run file's figures."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    page = (
        (root.parents[2] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text().split("**Single and uniform", 1)[1]
    )
    rows = re.findall(r"^\| (\w+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", page, re.M)
    assert len(rows) >= 5
    for arm, seed, auc, final, completion in rows:
        curve = json.loads((root / "pilot-3" / f"H-{arm}-{seed}.json").read_text())["run"]["curve"]
        assert auc == f"{sum(c['skill_success'] for c in curve) / len(curve):.3f}"
        assert final == f"{curve[-1]['skill_success']:.2f}"
        assert completion == f"{sum(c['completion'] for c in curve) / len(curve):.3f}"


def pilot_rows(pilot: int, section: str, until: str | None = None) -> list[tuple[str, ...]]:
    """The rows of a pilot's table on the pilots page (arm, seed, skill AUC, final skill success,
    completion AUC, skill share), each checked against its run file."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    page = (root.parents[2] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text().split(section, 1)[1]
    page = page.split(until, 1)[0] if until else page
    rows = re.findall(r"^\| (\w+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", page, re.M)
    for arm, seed, auc, final, completion, share in rows:
        run = json.loads((root / f"pilot-{pilot}" / f"H-{arm}-{seed}.json").read_text())["run"]
        curve = run["curve"]
        assert auc == f"{sum(c['skill_success'] for c in curve) / len(curve):.3f}"
        assert final == f"{curve[-1]['skill_success']:.2f}"
        assert completion == f"{sum(c['completion'] for c in curve) / len(curve):.3f}"
        assert share == f"{run['skill_share']:.3f}"
    return rows


def test_pilot_4s_table_is_its_run_files():
    """Every row of pilot 4's table on the pilots page is its run file's figures, skill share included."""
    assert len(pilot_rows(4, "**Pilot 4, single against uniform", "## Pilot 5")) == 4


def test_pilot_5s_table_is_its_run_files():
    """Every row of pilot 5's single-against-uniform and learnability tables is its run file's figures."""
    rows = pilot_rows(5, "**Pilot 5, single against uniform")
    arms = ["single"] * 2 + ["uniform"] * 2 + ["oracle"] * 2 + ["local", "pooled"] * 3  # learnability, paired sd
    assert [r[0] for r in rows] == arms


def test_the_gate_passes_on_the_mean_paired_difference_of_its_fresh_seeds_only_once_all_ran():
    """The gate's arithmetic: single − uniform per gate seed, their mean against GATE; undecided
    until every gate seed ran both arms; its seeds are none of the pilots'."""
    from redisync.study.plans.walker_contrast import GATE, GATE_SEEDS, LEARNABILITY_SEEDS, SD_SEEDS, gate_summary

    assert not set(GATE_SEEDS) & (set(LEARNABILITY_SEEDS) | set(SD_SEEDS))

    def run(arm: str, seed: int, auc: float) -> dict:
        return {"arm": arm, "seed": seed, "summary": {"skill_success_auc": auc}}

    singles = [run("single", s, 0.5) for s in GATE_SEEDS]
    uniforms = [run("uniform", s, 0.5 - GATE - d) for s, d in zip(GATE_SEEDS, (0.1, 0.0, -0.05), strict=True)]
    assert gate_summary(singles + uniforms[:2])["passed"] is None
    passed = gate_summary(singles + uniforms)
    assert passed["passed"] is True
    assert abs(passed["mean"] - (GATE + 0.05 / 3)) < 1e-12
    short = [run("uniform", s, 0.5 - GATE + 0.01) for s in GATE_SEEDS]
    assert gate_summary(singles + short)["passed"] is False


def test_the_plan_names_the_pilots_figures_the_gate_and_the_models_prediction_as_recorded():
    """The fourth plan's figures are the pilot runs', the model's committed prediction's and the
    gate's constants in the code that runs it."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import GATE, GATE_SEEDS

    root = Path(__file__).resolve().parents[2] / "records" / "ab"
    plan = " ".join((root.parents[1] / "docs" / "ab" / "fourth-study-plan.md").read_text().split())
    runs = root / "fourth-study" / "pilot-5"

    def auc(arm: str, seed: int) -> float:
        return json.loads((runs / f"H-{arm}-{seed}.json").read_text())["run"]["summary"]["skill_success_auc"]

    d600, d601 = auc("single", 600) - auc("uniform", 600), auc("single", 601) - auc("uniform", 601)
    assert f"+{d600:.3f} on seed 600, \N{MINUS SIGN}{-d601:.3f} on seed 601 (mean +{(d600 + d601) / 2:.3f})" in plan
    assert f"{auc('oracle', 600):.3f} on seeds 600 and 601" in plan
    assert auc("oracle", 601) == auc("oracle", 600)
    assert f"local on 610 and 611: {auc('local', 610)} and {auc('local', 611)}" in plan
    assert f"the fresh seeds **{GATE_SEEDS[0]}, {GATE_SEEDS[1]}, {GATE_SEEDS[2]}**" in plan
    assert f"**at least {GATE}**" in plan
    model = json.loads((root / "fourth-study" / "model-prediction.json").read_text())
    local, pooled = model["local"], model["pooled"]
    assert f"uniform share of {local['uniform_share']:.3f} against pooled's {pooled['uniform_share']:.3f}" in plan
    assert f"each shard {local['shard_distance']:.3f} (TV)" in plan
    assert f"{100 * local['skill_share']:.1f} % of their starts in the two hard bins against pooled's " in plan
    assert f"{100 * pooled['skill_share']:.1f} %" in plan
    assert f"about {pooled['failures_per_bin_window']:.2f} failures per bin" in plan
    warning = model["warning"]
    assert warning["fires"] is True
    assert (
        f"(a predicted {warning['predicted_shard_distance']:.3f} against its threshold {warning['threshold']:.3f})"
        in plan
    )


def test_the_study_page_counts_the_pilot_rounds_the_pilots_page_reports():
    """'five rounds, every one reported there': one section per round on the pilots page, and a run
    folder per round that ran."""
    import re
    from pathlib import Path

    from redisync.study.plans.walker_contrast import PILOT

    root = Path(__file__).resolve().parents[2] / "docs"
    rounds = re.findall(r"^## Pilot (\d+)", (root / "ab" / "fourth-study" / "pilots.md").read_text(), re.M)
    assert [int(r) for r in rounds] == list(range(1, PILOT + 1))
    words = {5: "five", 6: "six", 7: "seven"}
    assert f", {words[PILOT]} rounds, every one reported there" in " ".join((root / "study.md").read_text().split())
    changelog = " ".join((root.parent / "CHANGELOG.md").read_text().split())
    assert f"{words[PILOT]} pilot rounds (`docs/ab/fourth-study/pilots.md`)" in changelog
    assert all((root.parent / "records" / "ab" / "fourth-study" / f"pilot-{r}").is_dir() for r in range(1, PILOT + 1))


def test_the_paired_sd_and_the_plans_amendment_are_the_pilot_runs():
    """The pilots page's paired differences and sd, and the plan's minimum detectable effect, are
    computed from the paired-sd pilot's run files (pilot-5.json's summary agrees)."""
    import json
    import statistics
    from pathlib import Path

    from scipy import stats

    root = Path(__file__).resolve().parents[2] / "records" / "ab"
    runs = root / "fourth-study" / "pilot-5"

    def auc(arm: str, seed: int) -> float:
        return json.loads((runs / f"H-{arm}-{seed}.json").read_text())["run"]["summary"]["skill_success_auc"]

    d = [auc("local", s) - auc("pooled", s) for s in (610, 611, 612)]
    sd = statistics.stdev(d)
    assert json.loads((root / "fourth-study" / "pilot-5.json").read_text())["paired_sd"]["sd"] == sd
    pilots = " ".join((root.parents[1] / "docs" / "ab" / "fourth-study" / "pilots.md").read_text().split())
    listed = ", ".join(f"\N{MINUS SIGN}{-x:.3f}" for x in d)
    assert f"{listed} (mean \N{MINUS SIGN}{-sum(d) / 3:.3f}, sd {sd:.3f})" in pilots
    factor = stats.t.ppf(0.95, 9) + stats.t.ppf(0.80, 9)
    plan = " ".join((root.parents[1] / "docs" / "ab" / "fourth-study-plan.md").read_text().split())
    assert f"{factor / 10**0.5:.3f} · {sd:.3f} = **{factor / 10**0.5 * sd:.3f}**" in plan


def test_the_gates_result_on_the_pages_is_its_run_files():
    """gate.json is the gate runs' (each paired difference, their mean, the verdict), and the pilots
    page and the study page say that verdict with those numbers."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import GATE, GATE_SEEDS, gate_summary

    root = Path(__file__).resolve().parents[2] / "docs"
    gate_dir = root.parent / "records" / "ab" / "fourth-study" / "gate"
    runs = [json.loads(p.read_text())["run"] for p in sorted(gate_dir.glob("H-*.json"))]
    summary = gate_summary(runs)
    recorded = json.loads((root.parent / "records" / "ab" / "fourth-study" / "gate.json").read_text())
    assert recorded["passed"] == summary["passed"] is not None
    assert abs(recorded["mean"] - summary["mean"]) < 1e-12
    diffs = ", ".join(f"{summary['differences'][s]:+.3f}".replace("-", "\N{MINUS SIGN}") for s in GATE_SEEDS)
    verdict = "passed" if summary["passed"] else "failed"
    sentence = f"single \N{MINUS SIGN} uniform {diffs} (mean {summary['mean']:+.3f}".replace("-", "\N{MINUS SIGN}")
    for page in (root / "ab" / "fourth-study" / "pilots.md", root / "study.md"):
        text = " ".join(page.read_text().split())
        assert f"gate {verdict}" in text, page
        assert sentence.replace("\N{MINUS SIGN}", "-") in text.replace("\N{MINUS SIGN}", "-"), page
        assert f"the plan asked for {GATE}" in text, page


def test_the_contrast_is_judged_as_planned_only_once_every_seed_ran_both_arms():
    """local − pooled per contrast seed; the one-sided t-test and TOST only with all ten pairs; a
    consistent loss of 0.3 is "local lower", differences within ±0.02 are "equivalent"."""
    from redisync.study.plans.walker_contrast import CONTRAST_SEEDS, contrast_summary

    def run(arm, seed, v):
        return {"arm": arm, "seed": seed, "summary": {"skill_success_auc": v, "skill_share": 0.02}}

    loss = [0.3 + 0.01 * (i % 3) for i in range(len(CONTRAST_SEEDS))]
    runs = [run("pooled", s, 0.6) for s in CONTRAST_SEEDS] + [run("local", s, 0.6 - x) for s, x in
                                                             zip(CONTRAST_SEEDS, loss, strict=True)]  # fmt: skip
    partial = contrast_summary(runs[:-1])
    assert not partial["done"]
    assert "verdict" not in partial
    assert len(partial["differences"]) == 9
    full = contrast_summary(runs)
    assert full["done"]
    assert full["verdict"] == "local lower"
    assert full["p_one_sided_t"] < 1e-6
    assert math.isclose(full["mean"], -sum(loss) / len(loss))
    tiny = [run("pooled", s, 0.6) for s in CONTRAST_SEEDS] + [
        run("local", s, 0.6 + (0.02 if i % 2 else -0.02)) for i, s in enumerate(CONTRAST_SEEDS)
    ]
    assert contrast_summary(tiny)["verdict"] == "equivalent"


def test_the_contrast_is_refused_unless_the_gates_run_files_passed(tmp_path):
    """The committed gate's files pass; a folder without them (or with one arm's run missing) is refused
    before anything trains."""
    import shutil
    from pathlib import Path

    from redisync import errors
    from redisync.study.plans.walker_contrast import gate_passed, run_contrast

    committed = Path(__file__).resolve().parents[2] / "records" / "ab" / "fourth-study"
    assert gate_passed(committed)
    with pytest.raises(errors.ConfigurationError, match="gate has not passed"):
        run_contrast(tmp_path, workers=1)
    shutil.copytree(committed / "gate", tmp_path / "gate")
    (tmp_path / "gate" / "H-uniform-622.json").unlink()
    with pytest.raises(errors.ConfigurationError, match="gate has not passed"):
        run_contrast(tmp_path, workers=1)
    assert not (tmp_path / "contrast").exists()


def test_the_contrasts_result_on_the_pages_is_its_run_files():
    """contrast.json is the contrast's run files' summary, and the study page, the docs home, the
    README and the changelog give its verdict with its numbers."""
    import json
    from pathlib import Path

    from redisync.study.plans.walker_contrast import contrast_summary

    root = Path(__file__).resolve().parents[2]
    runs = [
        json.loads(p.read_text())["run"] for p in sorted((root / "records/ab/fourth-study/contrast").glob("H-*.json"))
    ]
    summary = contrast_summary(runs)
    recorded = json.loads((root / "records/ab/fourth-study/contrast.json").read_text())
    assert summary["done"]
    assert recorded["verdict"] == summary["verdict"]
    assert abs(recorded["mean"] - summary["mean"]) < 1e-12
    short = {
        "local lower": "unsynced shards learnt its skill segments worse than synced ones",
        "equivalent": "no difference between unsynced and synced shards larger than 0.1",
        "inconclusive": "neither a difference nor equivalence within ±0.1 established",
    }[summary["verdict"]]

    def text(path: str) -> str:
        return " ".join((root / path).read_text().split()).replace("\N{MINUS SIGN}", "-")

    lo, hi = summary["ci95"]
    study = text("docs/study.md")
    assert f"mean {summary['mean']:+.3f}, 95 % t-interval [{lo:+.3f}, {hi:+.3f}]" in study
    assert (
        f'"local lower" p {summary["p_one_sided_t"]:.3g}; equivalence within ±0.1 p {summary["p_equivalence"]:.3g}'
        in study
    )
    assert ", ".join(f"{summary['differences'][s]:+.3f}" for s in sorted(summary["differences"])) in study
    for page in ("docs/index.md", "README.md", "CHANGELOG.md"):
        assert short in text(page), page
    assert f"[{lo:+.3f}, {hi:+.3f}]" in text("README.md")
