"""Every process redisync starts dies with the process that started it.

Each test starts a parent (the demo's fleet, the study's worker pool, a bench's publishers, a bench's
redis-server) in a process of its own, waits until its children are working, SIGKILLs the parent (a
closed terminal, an OOM kill, a scheduler's cancel) and then checks by pid that no child is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import redis

from redisync.inspection import shard_leases
from redisync.store.client import connect
from tests.conftest import real_redis_or_skip
from tests.support import wait_for

pytestmark = pytest.mark.integration

GONE_WITHIN_S = 30.0  # a child stops its syncer first (5 s stop timeout); generous for a loaded machine


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])


def descendants(pid: int) -> set[int]:
    """Every living process below ``pid`` (children, grandchildren, ...)."""
    parents = {int(p): _ppid(int(p)) for p in os.listdir("/proc") if p.isdigit()}
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent to reap it (reparented zombies are reaped by init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_parent(script: str, tmp_path: Path) -> subprocess.Popen:
    with open(tmp_path / "parent.log", "w") as log:  # the child writes through its own copy
        return subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script)],
            cwd=Path(__file__).resolve().parents[1],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )


def kill_parent_and_wait_for_children(parent: subprocess.Popen, children: set[int]) -> set[int]:
    """SIGKILL the parent; the children still alive after GONE_WITHIN_S (killed then, not to leak)."""
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.monotonic() + GONE_WITHIN_S
    while time.monotonic() < deadline and any(alive(p) for p in children):
        time.sleep(0.2)
    left = {p for p in children if alive(p)}
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.extras("torch", "tqdm")
def test_the_demos_collectors_stop_with_their_parent_and_give_their_leases_up(tmp_path):
    """The demo's fleet, SIGKILLed while its synced phase runs: every collector (and its sidecar)
    is gone within seconds, each having stopped its syncer: no lease is renewed after, none is held;
    and each was given up as its parent died, so observers read the run as aborted, not finished."""
    url, run = real_redis_or_skip(), f"t-lifeline-{uuid.uuid4().hex[:8]}"
    parent = start_parent(
        f"""
        import tqdm
        from redisync.demo.collector import FleetConfig
        from redisync.demo.fleet import run_phase
        cfg = FleetConfig(shards=2, envs=64, steps=10_000_000, bins=10, snapshot_every=1_000_000)
        run_phase({url!r}, cfg, True, tqdm.tqdm(disable=True), {run!r}, keep=True)
        """,
        tmp_path,
    )
    r = redis.Redis.from_url(url)
    shards = f"redisync:{{{run}}}:shards"
    meta = f"redisync:{{{run}}}:meta"
    try:
        assert wait_for(lambda: int(r.hget(meta, "fleet_version") or 0) >= 4, timeout=180), (
            tmp_path / "parent.log"
        ).read_text()
        children = descendants(parent.pid)
        assert len(children) >= 2
        assert kill_parent_and_wait_for_children(parent, children) == set()
        now_us = int(r.time()[0]) * 1_000_000
        leases = {k.decode(): int(v) for k, v in r.hgetall(shards).items() if k.endswith(b":lease_until_us")}
        assert set(leases) == {"0:lease_until_us", "1:lease_until_us"}
        assert all(until <= now_us + 1_000_000 for until in leases.values()), (leases, now_us)  # given up
        time.sleep(1.5)
        again = {k.decode(): int(v) for k, v in r.hgetall(shards).items() if k.endswith(b":lease_until_us")}
        assert again == leases  # nobody renews them
        with connect(url, run) as store:
            assert store.leases().stopped == {0: "parent_exited", 1: "parent_exited"}
            assert shard_leases(store) == {0: "aborted", 1: "aborted"}  # a crash does not read as a finish
    finally:
        if parent.poll() is None:
            parent.kill()
        for key in r.scan_iter(f"redisync:{{{run}}}:*"):
            r.delete(key)


@pytest.mark.extras("torch", "gymnasium")
def test_a_study_pools_workers_die_with_the_study_and_a_resumed_study_drops_a_partial_run_file(tmp_path):
    """The study's worker pool, SIGKILLed while its runs train: every worker is gone within seconds.
    A run file the study was writing when it was killed (its temporary name) is removed on resume,
    never read as a run."""
    saved = tmp_path / "runs"
    parent = start_parent(
        f"""
        from dataclasses import replace
        from pathlib import Path
        from redisync.study.fleet import StudyConfig
        from redisync.study.study import run_cells
        cfg = replace(StudyConfig().smoke(), env_steps=10_000_000, envs_per_shard=16)
        run_cells(cfg, [("H", "local", [1, 2])], url=None, env_spec=None, workers=2, show_progress=False,
                  desc="t", saved=Path({str(saved)!r}))
        """,
        tmp_path,
    )
    try:
        # both workers started (the pool's workers, beside multiprocessing's resource tracker)
        assert wait_for(lambda: len(descendants(parent.pid)) >= 3, timeout=120)
        time.sleep(3)  # they are training
        children = descendants(parent.pid)
        assert kill_parent_and_wait_for_children(parent, children) == set()
    finally:
        if parent.poll() is None:
            parent.kill()

    from redisync.study import study

    saved.mkdir(exist_ok=True)
    partial = saved / ("H-local-1.json" + study.TMP_SUFFIX)
    partial.write_text('{"config": {"tr')  # what a kill in the middle of a write leaves
    study._remove_partial_runs(saved)
    assert list(saved.iterdir()) == []


def test_a_benchs_publisher_processes_die_with_the_bench(tmp_path):
    """bench's concurrency measurement, SIGKILLed while its publisher processes run: none is left."""
    url = real_redis_or_skip()
    parent = start_parent(
        f"""
        from redisync.bench.core import measure_concurrency
        measure_concurrency({url!r}, 64, 2, 600.0)
        """,
        tmp_path,
    )
    try:
        assert wait_for(lambda: len(descendants(parent.pid)) >= 2, timeout=120)
        time.sleep(2)
        children = descendants(parent.pid)
        assert kill_parent_and_wait_for_children(parent, children) == set()
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_whose_parent_dies_runs_its_cleanup_and_a_server_started_from_a_thread_outlives_the_thread(
    tmp_path,
):
    """The helper itself: a spawned child's ``finally`` runs when its parent is killed (ParentExited
    in its main thread); a program started by ``popen`` from a short-lived thread lives on while its
    starter's process does (PDEATHSIG follows the starting thread) and dies with that process."""
    marker = tmp_path / "cleaned"
    parent = start_parent(
        f"""
        import threading, time
        from redisync import lifeline
        from tests.test_lifeline import child_with_cleanup
        lifeline.spawn(child_with_cleanup, {str(marker)!r})
        t = threading.Thread(target=lambda: lifeline.popen(["sleep", "600"]))
        t.start(); t.join()
        time.sleep(600)
        """,
        tmp_path,
    )
    try:
        assert wait_for(lambda: (tmp_path / "cleaned.started").exists(), timeout=60)
        children = descendants(parent.pid)
        sleeper = [p for p in children if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep")]
        assert len(sleeper) == 1
        time.sleep(1)
        assert alive(sleeper[0])  # its starting thread is gone, the process is not
        assert kill_parent_and_wait_for_children(parent, children) == set()
        assert marker.read_text() == "ParentExited parent_exited"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_sent_sigterm_while_its_parent_lives_stops_as_terminated(tmp_path):
    """A SIGTERM from someone else (a scheduler's cancel) runs the same cleanup, and the stop's cause
    says it was not the parent's death: the lease a collector gives up then records ``terminated``."""
    marker = tmp_path / "cleaned"
    parent = start_parent(
        f"""
        import time
        from redisync import lifeline
        from tests.test_lifeline import child_with_cleanup
        lifeline.spawn(child_with_cleanup, {str(marker)!r})
        time.sleep(600)
        """,
        tmp_path,
    )
    try:
        assert wait_for(lambda: (tmp_path / "cleaned.started").exists(), timeout=60)
        (child,) = [p for p in descendants(parent.pid) if b"multiprocessing" in Path(f"/proc/{p}/cmdline").read_bytes()
                    and b"resource_tracker" not in Path(f"/proc/{p}/cmdline").read_bytes()]  # fmt: skip
        os.kill(child, signal.SIGTERM)
        assert wait_for(lambda: marker.exists() and marker.read_text().endswith("d"), timeout=30)
        assert marker.read_text() == "ParentExited terminated"
    finally:
        parent.kill()
        parent.wait(10)


def child_with_cleanup(marker: str) -> None:
    """A child that works until it is stopped and writes what stopped it."""
    Path(marker + ".started").write_text("")
    try:
        while True:
            time.sleep(0.1)
    except BaseException as e:
        from redisync import lifeline

        Path(marker).write_text(f"{type(e).__name__} {lifeline.stop_cause()}")
        raise


@pytest.mark.extras("torch")
def test_a_run_file_records_the_commit_the_package_versions_and_its_start_time(tmp_path):
    """A run reproduces only within one code version, so its file says which made it."""
    from redisync.study import study
    from redisync.study.fleet import StudyConfig

    run = {"condition": "H", "arm": "local", "seed": 1, "curve": []}
    study.save_run(tmp_path, StudyConfig(), run)
    held = json.loads((tmp_path / "H-local-1.json").read_text())
    origin = held["provenance"]
    assert len(origin["commit"].split("+")[0]) == 40
    assert {"python", "redisync", "numpy"} <= set(origin["packages"])
    assert origin["started"].endswith("+00:00")
    assert held["run"] == run
