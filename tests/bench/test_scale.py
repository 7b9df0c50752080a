"""``bench --scale`` in miniature: every figure is produced, and the fleet estimate's arithmetic."""

from __future__ import annotations

import pytest

from redisync import merge
from redisync.bench.scale import CORE_BUDGET, fleet_estimate, fleet_load, fold_and_pull, memory, throughput

pytestmark = pytest.mark.integration  # publisher processes against a redis-server of the module's own


def test_fold_pull_memory_and_throughput_are_measured(counted_url):
    """bench --scale measures the fold and the pull against slots, the memory of a run and the throughput of
    many connections."""
    real_url = counted_url  # (a server of the module's own: the bench turns the slow log on, server-wide)
    rows = [fold_and_pull(real_url, {"bench/key": merge(64, lifecycle="history")}, n, calls=10) for n in (2, 20)]
    assert [r["slots"] for r in rows] == [2, 20]
    assert all(r["fold_us"] > 0 and r["pull_us"] > 0 for r in rows)
    lean, audited = memory(real_url, 2, 256, False, reports=20), memory(real_url, 2, 256, True, reports=20)
    # the audited stream holds 20 payloads of 257 float64 more
    assert audited["bytes_total"] - lean["bytes_total"] > 20 * 257 * 8 * 0.9
    assert any(k.startswith("data:") for k in lean["bytes_by_key"])
    assert "reports" in lean["bytes_by_key"]
    tp = throughput(real_url, 2, seconds=0.5, processes=2)
    assert tp["connections"] == 2
    assert tp["publishes_per_s"] > 0
    assert tp["redis_cpu_share"] > 0


def test_the_fleet_estimate_adds_folds_and_capped_pulls():
    """The fleet estimate adds the folds and the pulls, each collector's pulls capped by its pull interval."""
    rows = [{"slots": 8, "fold_us": 100.0, "pull_us": 10.0}, {"slots": 64, "fold_us": 100.0, "pull_us": 10.0}]
    est = fleet_estimate(rows, interval_s=1.0)
    # 8 collectors: 8 folds of 100 us and 8 x 8 pulls of 10 us (each pulls after every fold, fewer than 10 a second)
    assert est["server_s_per_s"][8] == pytest.approx(8 * 100e-6 + 64 * 10e-6)
    # 64 collectors: 64 folds, and each collector's pulls capped at 10 a second
    assert est["server_s_per_s"][64] == pytest.approx(64 * 100e-6 + 640 * 10e-6)
    n = est["largest_fleet"]
    assert fleet_load(rows, n) <= CORE_BUDGET < fleet_load(rows, n * 1.02 + 1)
    # beyond the measured rows a fold grows with the vectors it reads: 16 + n/16
    assert fleet_load(rows, 1024) == pytest.approx(1024 * 100e-6 * (16 + 64) / (16 + 4) + 10240 * 10e-6)
