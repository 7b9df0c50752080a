"""`redisync inspect`, `snapshot` and `restore`: what a run holds, moved between runs, and their errors."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest

import redisync as redisync_api

from .conftest import cli


def test_inspect_shows_keys_slots_and_dead_letters(populated):
    """`redisync inspect` shows a run's keys with their semantics, versions, writers and slots, and its dead
    letters."""
    url, store = populated
    out = cli("inspect", "--url", url, "--run", store.run)
    assert out.returncode == 0, out.stderr
    assert f"run {store.run}" in out.stdout
    assert "fleet version 4" in out.stdout
    assert "dead letters 1" in out.stdout
    line = next(l for l in out.stdout.splitlines() if l.startswith("motion/bin_failed") and "merge" in l)
    assert line.split()[1:7] == ["merge", "4", "stale", "60.0s", "3", "0,1,2"]
    slots = [l.split() for l in out.stdout.splitlines() if l.startswith("motion/bin_failed") and "merge" not in l]
    assert [row[1] for row in slots] == ["0", "1", "2"]
    assert all(row[5:7] == ["1", "live"] for row in slots)
    from redisync.inspection import shard_leases

    leases = shard_leases(store)
    assert [row[7] for row in slots] == [leases.get(int(row[1]), "-") for row in slots]  # the lease column
    assert "not_owner curriculum/scale" in out.stdout
    report = json.loads(cli("inspect", "--url", url, "--run", store.run, "--json").stdout)[0]
    key = next(k for k in report["keys"] if k["key"] == "motion/bin_failed")
    assert [s["shard"] for s in key["slots"]] == [0, 1, 2]
    assert report["dead_letters"] == 1
    listing = cli("inspect", "--url", url)
    assert f"run {store.run}" in listing.stdout


def test_inspect_lists_every_readable_run_and_says_which_keys_it_skipped(populated):
    """Keys that only look like a run's meta (a foreign string, a hash without a schema) are named
    and skipped; the real runs are listed."""
    url, store = populated
    fake = [f"redisync:{{fake-{uuid.uuid4().hex[:6]}}}:meta" for _ in range(2)]
    store.redis.set(fake[0], "not a hash")
    store.redis.hset(fake[1], "owner", "someone else")
    try:
        out = cli("inspect", "--url", url)
        assert out.returncode == 0, out.stderr
        assert f"run {store.run}" in out.stdout
        for key in fake:
            assert f"skipped {key}: " in out.stderr
        as_json = cli("inspect", "--url", url, "--json")
        assert as_json.returncode == 0
        assert store.run in [r["run"] for r in json.loads(as_json.stdout)]
    finally:
        store.redis.delete(*fake)


def test_version_and_no_password_in_what_inspect_prints(real_url):
    """`--version` prints the package's version, and nothing inspect prints holds the URL's password."""
    out = cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"redisync, version {redisync_api.__version__}"
    with_password = real_url.replace("redis://", "redis://:hunter2@", 1)
    # a URL with a password the server ignores (requirepass unset): the run list is empty, the password masked
    out = cli("inspect", "--url", with_password, "--run", "no-such-run-here")
    assert "hunter2" not in out.stdout + out.stderr
    out = cli("inspect", "--url", with_password)
    assert "hunter2" not in out.stdout + out.stderr


def test_snapshot_and_restore_move_a_run(populated, tmp_path):
    """`redisync snapshot` then `redisync restore` moves a run's state into another run, value for value."""
    url, store = populated
    path = tmp_path / "run.json"
    out = cli("snapshot", "--url", url, "--run", store.run, str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(path.read_text())["format"] == "redisync.snapshot"
    copy = redisync_api.connect(url, run=store.run + "-copy")
    try:
        out = cli("restore", "--url", url, "--run", copy.run, str(path))
        assert out.returncode == 0, out.stderr
        want, got = store.fleet(), copy.fleet()
        for name in want.keys:
            np.testing.assert_array_equal(got.keys[name].value, want.keys[name].value)
        assert got.fleet_version > want.fleet_version
    finally:
        copy.delete()


def test_a_snapshot_into_a_missing_folder_is_one_line_naming_the_path(populated, tmp_path):
    """A snapshot into a folder that does not exist is one line naming the path and why, status 1."""
    url, store = populated
    path = tmp_path / "no-such-folder" / "snap.json"
    out = cli("snapshot", "--url", url, "--run", store.run, str(path))
    assert out.returncode == 1
    assert out.stderr.count("\n") == 1
    assert f"redisync: error: {path}: cannot write the snapshot there (No such file or directory)" in out.stderr


def test_snapshot_errors_name_the_file_and_the_problem(populated, tmp_path):
    """A snapshot file that is missing, not JSON, not a snapshot or damaged is refused naming the file and the
    problem."""
    url, store = populated
    missing, not_json, no_run, damaged = (
        tmp_path / n for n in ("missing.json", "not.json", "norun.json", "damaged.json")
    )
    not_json.write_text("garbage")
    no_run.write_text("{}")
    assert cli("snapshot", "--url", url, "--run", store.run, str(damaged)).returncode == 0
    snap = json.loads(damaged.read_text())
    snap["hashes"]["meta"]["fleet_version"] = "not base64!"
    damaged.write_text(json.dumps(snap))
    for path, problem in (
        (missing, "no such file"),
        (not_json, "is not a redisync snapshot: not JSON"),
        (no_run, "is not a redisync snapshot: the field 'run' is missing"),
        (damaged, "meta"),
    ):
        out = cli("restore", "--url", url, "--run", store.run, str(path))
        assert out.returncode == 1, out.stderr
        assert f"redisync: error: {path}" in out.stderr, out.stderr
        assert problem in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1
        assert "Traceback" not in out.stderr
    assert store.fleet().fleet_version == 4  # nothing was restored


@pytest.mark.integration  # a collector process, killed
def test_inspect_says_how_long_a_run_has_been_quiet_when_its_leases_still_read_live(real_url, tmp_path):
    """A fleet that died whole (its collector SIGKILLed: no lease given up) reads ``live`` in one
    reading - the run's clock advances only with its calls - and inspect said nothing more; now it
    says how long no collector has called, and that one reading cannot tell dead from stalled."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from redisync.store.schema import Limits, Schema, merge

    run = f"cli-quiet-{uuid.uuid4().hex[:8]}"
    store = redisync_api.connect(real_url, run=run)
    store.register(Schema.of({"t/stats": merge(2, lifecycle="history")}), Limits(stall_after_s=0.2))
    root = Path(__file__).resolve().parents[2]
    code = (
        "import time, redisync\n"
        "from redisync.collector.workers import new_syncer\n"
        "from tests.collector.test_sidecar import Cumulative\n"
        f"store = redisync.connect({real_url!r}, run={run!r})\n"
        "term = Cumulative(2)\n"
        "syncer = new_syncer(store, 0, [term], worker='thread').start()\n"
        "term.step(); syncer.on_step(); syncer.flush()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    collector = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(root)),
    )
    try:
        assert collector.stdout is not None
        assert collector.stdout.readline().strip() == "ready"
        os.kill(collector.pid, signal.SIGKILL)  # the whole fleet dies: nobody calls the run again
        collector.wait(30)
        time.sleep(1.0)  # past the run's stall cap (0.2 s)
        out = cli("inspect", "--url", real_url, "--run", run)
        assert out.returncode == 0, out.stderr
        assert "no collector has called this run for" in out.stdout
        described = json.loads(cli("inspect", "--url", real_url, "--run", run, "--json").stdout)[0]
        assert described["leases"] == {"0": "live"}
        assert described["quiet_s"] >= 1.0
    finally:
        if collector.poll() is None:
            collector.kill()
            collector.wait(30)
        collector.stdout.close()  # type: ignore[union-attr]
        store.delete()


def test_delete_removes_a_finished_run_and_refuses_one_with_live_collectors(populated, real_url):
    """``redisync delete``: a dead run's lapsed shards kept an alert firing and no command removed it.
    It deletes a run whose collectors are gone, and refuses one whose lease is live (unless --force)."""
    from redisync.collector.workers import new_syncer

    from ..collector.test_sidecar import Cumulative

    url, store = populated
    out = cli("delete", "--url", url, "--run", store.run)
    assert out.returncode == 0, out.stderr
    assert f"deleted run {store.run}" in out.stdout
    assert store.run not in redisync_api.connect(url, run="any").run_names()
    live_store = redisync_api.connect(real_url, run=f"cli-live-{uuid.uuid4().hex[:8]}")
    syncer = new_syncer(live_store, 0, [Cumulative()], worker="thread").start()
    try:
        syncer.flush()
        out = cli("delete", "--url", real_url, "--run", live_store.run)
        assert out.returncode == 1
        assert "has live collectors (shards 0)" in out.stderr
        assert live_store.run in live_store.run_names()
    finally:
        syncer.stop()
        live_store.delete()


def test_inspect_says_why_a_shard_holds_no_slot_of_a_key(real_url):
    """A state key's writers 0,2,3 of 4 read as a gap; inspect now names each missing shard with its
    lease and why a state key has no slot for it (one that stopped gave it up), and says a history key
    keeps a slot once written."""
    from redisync.store.schema import Schema, merge

    store = redisync_api.connect(real_url, run=f"cli-gap-{uuid.uuid4().hex[:8]}")
    try:
        store.register(
            Schema.of({"motion/ema": merge(2, lifecycle="state"), "obs/norm": merge(2, lifecycle="history")})
        )
        shards = [store.shard(k) for k in range(4)]
        for k, shard in enumerate(shards):
            reports = {"motion/ema": {"count": 1.0, "sum": [1.0, float(k)]}}
            if k != 3:
                reports["obs/norm"] = {"count": 1.0, "sum": [1.0, float(k)]}
            shard.publish(reports)
            store.lease(k, shard.incarnation, 60_000)
        store.lease(1, shards[1].incarnation, 0)  # shard 1 stops: gives its lease up
        shards[0].publish({"motion/ema": {"count": 1.0, "sum": [2.0, 0.0]}})  # (a fold that drops its slot)
        out = cli("inspect", "--url", real_url, "--run", store.run)
        assert out.returncode == 0, out.stderr
        line = next(l for l in out.stdout.splitlines() if l.startswith("motion/ema") and "merge" in l)
        assert "0,2,3" in line.split()
        assert (
            "motion/ema: no slot for shard 1 (stopped): a state key drops the slot of a shard that stopped, was "
            "aborted, lapsed or went stale" in out.stdout
        )
        assert (
            "obs/norm: no slot for shard 3 (live): a history key keeps a slot once written until its shard has been "
            "gone for its retire_after_s (then retired: still counted)" in out.stdout
        )
        guide = " ".join(
            (Path(__file__).resolve().parents[2] / "docs" / "guides" / "monitoring.md").read_text().split()
        )
        assert (
            "(stopped): a state key drops the slot of a shard that stopped, was aborted, lapsed or went stale" in guide
        )
    finally:
        store.delete()
