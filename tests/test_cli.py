"""The command line end to end: demo, bench and inspect, on the embedded store and a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from redisync.schema import Schema, broadcast, merge

from .conftest import new_store, real_redis_or_skip


def redisync(*args: str, env_url: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "redisync.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_demo_shows_drift_without_sync_and_agreement_with_it(backend, tmp_path):
    url = ["--url", real_redis_or_skip()] if backend == "real" else []
    out = redisync("demo", *url, "--shards", "2", "--steps", "2000", "--envs", "512", "--out", str(tmp_path), "--no-progress")
    assert out.returncode == 0, out.stderr
    off, on = out.stdout.split("sync ON")
    worst_off = float(off.rsplit("largest TV distance from the pooled distribution:", 1)[1].split()[0])
    worst_on = float(on.rsplit("largest TV distance from the pooled distribution:", 1)[1].split()[0])
    assert worst_off > 0.1 and worst_on < worst_off / 4
    publishes = int(on.split(" publishes")[0].rsplit(", ", 1)[1])
    assert publishes >= 2000 // 25  # the collectors published on their schedule
    png = tmp_path / "demo.png"
    assert png.stat().st_size > 20_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_json_on_real_redis(real_url):
    out = redisync("bench", "--url", real_url, "--json", "--calls", "20", "--procs", "2", "--seconds", "0.5")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ping_us"] > 0 and [s["elements"] for s in res["sizes"]] == [64, 1024, 16384]
    for s in res["sizes"]:
        assert s["publish_us"] > 0 and s["server_fold_us"] > 0 and s["pull_changed_us"] > 0
    c = res["concurrency"]
    assert c["lua_publishes_per_s"] > 0 and c["watch_publishes_per_s"] > 0
    assert set(res["targets"]) >= {"publish_64_over_ping<=1.5", "server_fold_ns_per_value<=250"}


def test_inspect_lists_runs_keys_and_versions(real_url):
    store = new_store("real")
    try:
        store.register(Schema.of({"motion/bin_failed": merge(3), "curriculum/scale": broadcast(())}))
        store.shard(2).publish({"motion/bin_failed": {"count": 1, "sum": np.ones(3)}})
        out = redisync("inspect", "--url", real_url, "--run", store.run)
        assert out.returncode == 0, out.stderr
        assert f"run {store.run}" in out.stdout and "fleet version 1" in out.stdout
        line = next(l for l in out.stdout.splitlines() if l.startswith("motion/bin_failed"))
        assert line.split()[1:5] == ["merge", "3", "1", "2"]
        as_json = json.loads(redisync("inspect", "--url", real_url, "--run", store.run, "--json").stdout)
        assert as_json[0]["keys"][1]["writers"] == "2"
    finally:
        store.delete()


@pytest.mark.parametrize(
    "args, words",
    [
        (["inspect", "--url", "redis://127.0.0.1:1"], "Connection refused"),
        (["inspect", "--url", "http://nowhere"], "unsupported URL"),
        (["inspect", "--run", "no-such-run"], "no run 'no-such-run'"),
        (["demo", "--shards", "0"], "--shards"),
        (["demo", "--url", "redis://127.0.0.1:1", "--no-progress", "--steps", "200", "--shards", "1"], "Connection refused"),
    ],
)
def test_bad_arguments_print_one_line_and_exit_nonzero(args, words):
    out = redisync(*args)
    assert out.returncode != 0
    assert words in out.stderr and "Traceback" not in out.stderr
