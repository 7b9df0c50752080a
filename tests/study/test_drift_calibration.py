"""The measured-drift warning against the committed walker runs: the new rule fires on every local
run's records (where unsynced shards learnt worse) and on no pooled run's; the sampler's old rule
fired on none of them; the threshold in use is the calibration's, recomputed from the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from redisync.study import drift_calibration
from redisync.terms import formulas

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_calibration_is_what_the_run_files_give():
    """The page and its figures regenerate from the run files, to the character."""
    result = drift_calibration.calibrate()
    committed = json.loads((ROOT / "records" / "ab" / "drift-warning-calibration.json").read_text())
    assert json.loads(json.dumps(result)) == committed
    assert drift_calibration.report(result) == (ROOT / "docs" / "ab" / "drift-warning-calibration.md").read_text()
    assert round(result["calibrated_threshold"], 2) == formulas.DRIFT_WARNING_TV


def test_the_new_rule_fires_on_every_local_walker_run_and_no_pooled_one_and_the_old_one_on_none():
    """Replayed on each committed contrast run file: the new rule separates the arms; the old one
    (`ema_warning`) fired on 0 of the 10 local runs where harm was shown."""
    runs = sorted((ROOT / "records" / "ab" / "fourth-study" / "contrast").glob("*.json"))
    local = [json.loads(p.read_text()) for p in runs if "-local-" in p.name]
    pooled = [json.loads(p.read_text()) for p in runs if "-pooled-" in p.name]
    assert len(local) == len(pooled) == 10
    fires = lambda run: drift_calibration.peak_running_mean(run) >= formulas.DRIFT_WARNING_TV  # noqa: E731
    assert all(fires(run) for run in local)
    assert not any(fires(run) for run in pooled)
    assert not any(drift_calibration.old_rule_fires(run) for run in local)
    # the replay is the sampler's own rule: a run's peak, fed as measurements, makes it warn
    run = local[0]
    peak = drift_calibration.peak_running_mean(run)
    assert formulas.drift_warning(peak, formulas.DRIFT_WARNING_MEASUREMENTS, "shard") is not None


@pytest.mark.extras("torch", "scipy")  # (the fifth study's power figure: the study extra's modules)
def test_the_pages_figures_about_the_warning_and_the_walkers_drift_are_the_records():
    """The study page, the collector guide, the README and the changelog say what the files give:
    the threshold, the firing counts, the old rule's silence on the walker's shard records, the
    recorded drift against advise's prediction, the contrast's sd and the MDE it achieved."""
    import numpy as np

    from redisync.study.plans import walker_fleet_shapes as fifth_study

    result = drift_calibration.calibrate()
    rows = {(r["task"], r["arm"]): r for r in result["rows"]}
    runs = sorted((ROOT / "records" / "ab" / "fourth-study" / "contrast").glob("H-local-*.json"))
    local = [json.loads(p.read_text())["run"] for p in runs]
    shard_records = sum(len(r["tv"]) for run in local for r in run["drift"])
    recorded = np.mean([np.mean(r["tv"]) for run in local for r in run["drift"] if r["tv"]])
    predicted = json.loads((ROOT / "records" / "ab" / "fourth-study" / "model-prediction.json").read_text())
    contrast = json.loads((ROOT / "records" / "ab" / "fourth-study" / "contrast.json").read_text())
    sd = float(np.std(list(contrast["differences"].values()), ddof=1))

    def page(*path: str) -> str:  # (its words, whatever its line breaks)
        return " ".join(ROOT.joinpath(*path).read_text().split())

    study, guide = page("docs", "study.md"), page("docs", "guides", "collector.md")
    readme, changelog = page("README.md"), page("CHANGELOG.md")
    assert rows[("walker", "local")]["fires"] == rows[("walker", "local")]["seeds"] == 10
    assert rows[("walker", "pooled")]["fires"] == 0
    assert rows[("walker", "local")]["old_rule_fires"] == 0
    assert f"**{formulas.DRIFT_WARNING_TV:.2f}** over at least {formulas.DRIFT_WARNING_MEASUREMENTS}" in guide
    assert f"{rows[('toy', 'local')]['fires']} of 10 seeds of an arm where no harm" in guide
    assert f"none of the {shard_records:,} shard".replace(",", " ") in guide
    assert f"none of the local runs' {shard_records:,} shard".replace(",", " ") in study
    assert f"0 of {shard_records:,} shard records".replace(",", " ") in changelog
    assert "it fires on 10 of 10 local runs and 0 of 10 pooled ones" in study
    shard = predicted["local"]["shard_distance"]
    assert f"shard {shard:.3f} (TV) from the pooled distribution, where the local runs recorded {recorded:.3f}" in study
    assert f"{shard:.3f} against {recorded:.3f}" in readme
    assert f"the contrast's own sd was {sd:.3f}" in study
    assert f"sd {sd:.3f}" in changelog
    assert f"could detect with 80 % power was {fifth_study.minimum_detectable_effect(10, sd):.3f}" in study
