"""The measured-drift warning against the committed walker runs: the new rule fires on every local
run's records (where unsynced shards learnt worse) and on no pooled run's; the sampler's old rule
fired on none of them; the threshold in use is the calibration's, recomputed from the files."""

from __future__ import annotations

import json
from pathlib import Path

from redisync.study import drift_calibration
from redisync.terms import formulas

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_calibration_is_what_the_run_files_give():
    """The page and its figures regenerate from the run files, to the character."""
    result = drift_calibration.calibrate()
    committed = json.loads((ROOT / "docs" / "ab" / "drift-warning-calibration.json").read_text())
    assert json.loads(json.dumps(result)) == committed
    assert drift_calibration.report(result) == (ROOT / "docs" / "ab" / "drift-warning-calibration.md").read_text()
    assert round(result["calibrated_threshold"], 2) == formulas.DRIFT_WARNING_TV


def test_the_new_rule_fires_on_every_local_walker_run_and_no_pooled_one_and_the_old_one_on_none():
    """Replayed on each committed contrast run file: the new rule separates the arms; the old one
    (`ema_warning`) fired on 0 of the 10 local runs where harm was shown."""
    runs = sorted((ROOT / "docs" / "ab" / "fourth-study" / "contrast").glob("*.json"))
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
