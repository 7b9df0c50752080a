"""`redisync bench`: its figures, beside their floors, and the targets for developers only."""

from __future__ import annotations

import json

import pytest

from .conftest import cli


@pytest.mark.integration  # two bench runs, each with publisher processes of its own
def test_bench_prints_figures_and_the_targets_only_for_developers(counted_url):
    """A user read 'target ...: MISSED' lines as a broken install: targets are behind --targets."""
    real_url = counted_url  # (the bench turns the slow log on: CONFIG SET, server-wide)
    args = ("bench", "--url", real_url, "--calls", "20", "--procs", "2", "--seconds", "0.3")
    plain, dev = cli(*args), cli(*args, "--targets")
    assert plain.returncode == 0, plain.stderr
    assert dev.returncode == 0, dev.stderr
    assert "PING median" in plain.stdout
    assert "publish us" in plain.stdout
    assert "target" not in plain.stdout
    assert "target pull_unchanged_over_ping<=1.15:" in dev.stdout


@pytest.mark.integration  # a redis-server of its own
def test_bench_json_on_real_redis(counted_url):
    """`redisync bench --json` prints every figure, each publish beside its transport floor measured in the
    same run."""
    real_url = counted_url  # (the bench turns the slow log on: CONFIG SET, server-wide)
    out = cli("bench", "--url", real_url, "--json", "--calls", "20", "--procs", "2", "--seconds", "0.5")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ping_us"] > 0
    assert [s["elements"] for s in res["sizes"]] == [64, 1024, 16384]
    for s in res["sizes"]:
        assert s["publish_us"] > 0
        assert s["server_fold_us"] > 0
        assert s["pull_changed_us"] > 0
        assert s["publish_floor_us"] > 0  # the transport floor, in the same run
        assert s["publish_over_floor"] == pytest.approx(s["publish_us"] / s["publish_floor_us"])
        assert s["pull_changed_polled_us"] > 0
    c = res["concurrency"]
    assert c["lua_publishes_per_s"] > 0
    assert c["watch_publishes_per_s"] > 0
    assert set(res["targets"]) >= {"pull_unchanged_over_ping<=1.15", "server_fold_ns_per_value_at_4_slots<=200"}
    assert not any("publish_64_over_ping" in name for name in res["targets"])  # retired: it measured PING
    assert all(s["slots"] == 4 for s in res["sizes"])
    assert res["server_fold_ns_per_value"] is not None
    from redisync.bench.core import PHASES

    profile = res["fold_profile_us"]["1024"]  # every phase of the fold, read off the server's clock
    assert list(profile) == [name for name, _ in PHASES]
    assert all(v >= 0 for v in profile.values())
    assert profile["validate and compute"] > 0
