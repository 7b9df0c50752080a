"""The sidecar's own life, event by event: each test is one way its life used to lose, repeat or
misreport a report (issue 23), against a real Redis. The sidecar holds no state of its own: what a
successor continues from lives in the collector's mailbox header or in the store."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import redis

import redisync
from redisync.collector.mailbox import SIDECAR_PID
from redisync.collector.workers import new_syncer

from ..faults import HoldingProxy, SilentServer
from ..servers import RedisProcess
from ..support import wait_for
from .test_sidecar import KEY, Cumulative, _alive

ROOT = Path(__file__).resolve().parents[2]


class Versions(Cumulative):
    """A copy-path term that records every (epoch, version) the collector applied."""

    def __init__(self) -> None:
        super().__init__()
        self.applied: list[tuple[str, int]] = []

    def apply_shard_state(self, fleet) -> None:
        super().apply_shard_state(fleet)
        self.applied.append((fleet.epoch, fleet.fleet_version))


def _count(store) -> float:
    return float(store.fleet().keys[KEY].parts()["count"])


def _train(term, syncer, steps: int) -> None:
    for _ in range(steps):
        term.step()
        syncer.on_step()
        syncer.at_reset_boundary()


def _serving(syncer) -> bool:
    return syncer.worker.mailbox is not None and syncer.worker.mailbox.header[SIDECAR_PID] == syncer.worker.sidecar_pid


def test_a_syncer_started_from_a_short_lived_thread_keeps_its_sidecar_and_stop_publishes(real_url):
    """1. The sidecar follows the collector's process, not the thread that spawned it (a restarted
    sidecar, spawned by the monitor thread, survives stop() ending that thread)."""
    store = redisync.connect(real_url, run=f"faults-thread-{os.getpid()}")
    term = Cumulative()
    box: dict = {}
    starter = threading.Thread(
        target=lambda: box.update(
            syncer=new_syncer(
                store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600
            ).start()
        )
    )
    starter.start()
    starter.join()
    syncer = box["syncer"]
    try:
        first = syncer.worker.sidecar_pid
        time.sleep(1.0)
        assert _alive(first), "the sidecar died with the thread that started it"
        _train(term, syncer, 5)
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: syncer.worker.sidecar_pid != first and _serving(syncer), timeout=15)
        _train(term, syncer, 5)
        stopper = threading.Thread(target=syncer.stop)
        stopper.start()
        stopper.join()
        assert _count(store) == 10
    finally:
        syncer.stop(flush=False)
        store.delete()


def test_stop_right_after_a_sidecar_crash_publishes_the_last_report(real_url):
    """2. Whenever the last sidecar died, stop() publishes the last report."""
    store = redisync.connect(real_url, run=f"faults-stop-crash-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600).start()
    try:
        _train(term, syncer, 7)
        pid = syncer.worker.sidecar_pid
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: not _alive(pid), timeout=5)
        syncer.stop(flush=True)  # within the monitor's quarter of a second
        assert _count(store) == 7
    finally:
        syncer.stop(flush=False)
        store.delete()


def _through_proxy(real_url: str, run: str):
    store = redisync.connect(real_url, run=run)
    store.register(redisync.Schema.of(Cumulative().schema_entries()))
    kwargs = redis.Redis.from_url(real_url).connection_pool.connection_kwargs
    proxy = HoldingProxy(kwargs["port"], store.scripts.fold.name.encode())
    proxy.url = f"redis://127.0.0.1:{proxy.port}/{kwargs.get('db', 0)}"
    return store, proxy


@contextlib.contextmanager
def _sidecar_through_a_proxy(real_url: str, name: str):
    """(store, proxy, term, syncer): a sidecar worker publishing every step through a HoldingProxy."""
    store, proxy = _through_proxy(real_url, f"faults-{name}-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(
        redisync.connect(proxy.url, run=store.run),
        0,
        [term],
        worker="process",
        publish_every_steps=1,
        poll_every_s=0.05,
    ).start()
    try:
        yield store, proxy, term, syncer
    finally:
        syncer.stop(flush=False)
        proxy.close()
        store.delete()


def _kill_mid_publish(term, syncer, proxy, store) -> None:
    """Five steps published, then the sixth's fold held on the wire while its sidecar is SIGKILLed;
    returns once the successor serves."""
    _train(term, syncer, 5)
    syncer.flush()
    assert syncer.wait_synced(timeout=10)
    assert _count(store) == 5
    proxy.hold = 1
    _train(term, syncer, 1)
    assert wait_for(lambda: len(proxy.held) == 1, timeout=10)  # the fold of count 6 is on its way
    pid = syncer.worker.sidecar_pid
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: syncer.worker.sidecar_pid != pid and _serving(syncer), timeout=15)


def test_a_sidecar_killed_mid_publish_is_followed_by_one_that_sends_the_report(real_url):
    """3. The publish mark moves on the store's answer only: a successor sends what its
    predecessor took but never got answered, and wait_synced() means the store holds it."""
    with _sidecar_through_a_proxy(real_url, "mid-publish") as (store, proxy, term, syncer):
        _kill_mid_publish(term, syncer, proxy, store)
        proxy.held.clear()  # the fold of count 6 never arrives
        assert syncer.wait_synced(timeout=10)
        assert _count(store) == 6


def test_a_fold_in_flight_from_a_dead_sidecar_does_not_take_its_successors_seq(real_url):
    """4. The seq is reserved in the collector's memory before a fold is sent: a successor goes on
    above it, so the dead sidecar's fold landing late never makes the successor's a duplicate."""
    with _sidecar_through_a_proxy(real_url, "in-flight") as (store, proxy, term, syncer):
        _kill_mid_publish(term, syncer, proxy, store)
        time.sleep(0.5)  # the successor has read the server's last folded seq
        proxy.release()  # the dead sidecar's fold lands now
        _train(term, syncer, 4)
        syncer.flush()
        assert syncer.wait_synced(timeout=10)
        assert _count(store) == 10
        assert not [d for d in store.dead_letters() if d["reason"] != "seq_rollback"]


@pytest.mark.integration  # a redis-server of its own, restarted from its append-only file
def test_a_sidecar_restarted_while_redis_was_down_never_hands_an_older_version_of_the_same_epoch(tmp_path):
    """5. The newest (epoch, version) handed to the collector lives in its memory: after Redis came
    back from an append-only file with its tail lost, the successor does not hand (e, v2) after
    (e, v5); it re-publishes and the fleet moves on in a new epoch, as with the thread worker."""
    server = RedisProcess(tmp_path, None, "--appendonly", "yes", "--appendfsync", "always").start()
    try:
        url = server.url
        store = redisync.connect(url, run="lost-tail")
        term = Versions()
        syncer = new_syncer(
            redisync.connect(url, run="lost-tail", socket_timeout=1.0),
            0,
            [term],
            worker="process",
            publish_every_steps=1,
            poll_every_s=0.05,
            retry_every_s=0.1,
        ).start()
        try:
            _train(term, syncer, 2)
            assert syncer.wait_synced(timeout=10)
            assert syncer.at_reset_boundary() is not None
            saved = tmp_path / "aof-early"
            shutil.copytree(tmp_path / "appendonlydir", saved)  # the file as it was at an early version
            for _ in range(4):
                _train(term, syncer, 1)
                assert syncer.wait_synced(store.fleet().fleet_version, timeout=10)
            syncer.at_reset_boundary()
            before = term.applied[-1]
            server.kill()
            os.kill(syncer.worker.sidecar_pid, signal.SIGKILL)  # its successor starts while Redis is down
            time.sleep(1.0)
            shutil.rmtree(tmp_path / "appendonlydir")
            shutil.copytree(saved, tmp_path / "appendonlydir")  # the tail is lost
            server.start()  # no step after it: what the successor hands over comes from its own pull
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and term.applied[-1] == before:
                syncer.at_reset_boundary()
                time.sleep(0.05)
            assert term.applied[-1] != before, "no state applied after the restart"
            for (e0, v0), (e1, v1) in zip(term.applied, term.applied[1:], strict=False):
                assert e1 != e0 or v1 > v0, f"handed ({e1}, v{v1}) after ({e0}, v{v0})"
            assert term.applied[-1][0] != before[0]  # the fold opened a new epoch on the new server process
        finally:
            syncer.stop(flush=False)
    finally:
        server.kill()


FORK_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, {root!r})
import numpy as np, torch, redisync
from redisync.integrations import ProcessFleet
from redisync.terms.torch import AdaptiveMotionSampler
from tests.collector.test_sidecar import Cumulative
store = redisync.connect({url!r}, run={run!r})
term, sampler = Cumulative(), AdaptiveMotionSampler(100, 0.02, shard_id=0, rebuild_tol=0.0, dtype=torch.float64)
fleet = ProcessFleet(store, 0, worker="process", publish_every_steps=1000, publish_every_s=3600)
fleet.add(term, sampler)
fleet.start()
for _ in range(5):
    term.step(); sampler.record_failures(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)); sampler.step()
    fleet.on_step()
own = sampler.bin_failed_count.clone()
child = os.fork()
if child == 0:  # the child trains its copies (its own memory now) and exits normally: atexit runs
    for _ in range(50):
        term.step(); sampler.record_failures(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool)); sampler.step()
        fleet.on_step()
    fleet.flush()
    sys.exit(0)
os.waitpid(child, 0)
sidecar = fleet.syncer.worker.sidecar_pid
alive = os.path.exists(f"/proc/{{sidecar}}")
same = bool(torch.equal(own, sampler.bin_failed_count))
fleet.stop()
parts = store.fleet().keys
print(json.dumps({{"alive": alive, "same": same, "count": float(parts["t/stats"].parts()["count"]),
                  "ema_equal": bool(np.allclose(parts["motion/bin_failed"].parts()["sum"], own.numpy(), rtol=1e-12))}}))
"""


@pytest.mark.extras("torch")
def test_a_forked_child_never_stops_or_writes_into_its_parents_sync(real_url):
    """6. A child inherits the fleet and its atexit hook: its exit stops nothing, and its terms write
    into private copies, not into the parent's shared reports."""
    run = f"faults-fork-{os.getpid()}"
    script = FORK_SCRIPT.format(root=str(ROOT), url=real_url, run=run)
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result == {"alive": True, "same": True, "count": 5.0, "ema_equal": True}, result
    finally:
        redisync.connect(real_url, run=run).delete()


@pytest.mark.extras("torch")
def test_a_collector_importing_redisync_from_a_source_tree_gets_a_working_sidecar(real_url, tmp_path):
    """8. The sidecar imports redisync from the collector's sys.path, not only from site-packages."""
    import site

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    deps = next(p for p in site.getsitepackages() if p.endswith("site-packages"))
    inner = next((venv / "lib").glob("python3*/site-packages"))
    (inner / "deps.pth").write_text(
        deps + "\n"
    )  # numpy, redis, pydantic; not the editable redisync (its .pth is not read)
    run = f"faults-source-tree-{os.getpid()}"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import redisync
        from redisync.collector.workers import new_syncer
        from tests.collector.test_sidecar import Cumulative
        store = redisync.connect({real_url!r}, run={run!r})
        term = Cumulative()
        syncer = new_syncer(store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600).start()
        for _ in range(3):
            term.step(); syncer.on_step()
        print("healthy" if syncer.health()["ok"] else syncer.health()["error"], flush=True)
        syncer.stop()
        print(float(store.fleet().keys["t/stats"].parts()["count"]))
    """)
    try:
        check = subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import redisync"], capture_output=True, cwd=tmp_path
        )
        assert check.returncode != 0, "the test venv must not see the editable install"
        out = subprocess.run(
            [str(venv / "bin" / "python"), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split() == ["healthy", "3.0"], out.stdout + out.stderr[-2000:]
    finally:
        redisync.connect(real_url, run=run).delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_start_against_a_silent_store_returns_within_its_timeout_and_says_why(worker):
    """9. A store that accepts connections and never answers holds start() and stop() for their
    timeouts only, not the socket's (the bounds are half of it: a sidecar process starting on a
    loaded machine takes seconds, never 15)."""
    silent = SilentServer()
    url = silent.url
    term = Cumulative()
    socket_timeout_s = 30
    syncer = new_syncer(
        redisync.connect(url, run="silent", socket_timeout=socket_timeout_s),
        0,
        [term],
        worker=worker,
        start_timeout_s=1.0,
    )
    try:
        t = time.monotonic()
        syncer.start()
        elapsed = time.monotonic() - t
        assert elapsed < socket_timeout_s / 2, f"start() blocked {elapsed:.1f} s"
        health = syncer.health()
        assert not health["ok"]
        assert "did not answer" in health["error"]
        _train(term, syncer, 3)  # the hot path works meanwhile
    finally:
        t = time.monotonic()
        syncer.stop(timeout=1.0)
        assert time.monotonic() - t < socket_timeout_s / 2
        silent.close()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_zombie_whose_shard_a_later_process_claimed_is_not_healthy(real_url, worker):
    """10. A later process took the shard over: the earlier one's reports are refused, and it says
    so for good, even while its pulls succeed."""
    store = redisync.connect(real_url, run=f"faults-zombie-{worker}-{os.getpid()}")
    first, second = Cumulative(), Cumulative()
    a = new_syncer(store, 0, [first], worker=worker, publish_every_steps=1, poll_every_s=0.05).start()
    b = new_syncer(
        redisync.connect(real_url, run=store.run),
        0,
        [second],
        worker=worker,
        publish_every_steps=1,
        poll_every_s=0.05,
        take_over=True,
    ).start()
    try:
        _train(second, b, 3)
        assert b.wait_synced(timeout=10)
        _train(first, a, 3)
        assert wait_for(lambda: not a.health()["ok"], timeout=10)
        time.sleep(1.0)  # pulls keep succeeding meanwhile
        health = a.health()
        assert not health["ok"]
        assert "later process claimed shard 0" in health["error"]
        assert a.metrics()["redisync/healthy"] == 0.0
        assert b.health()["ok"]
    finally:
        a.stop(flush=False)
        b.stop(flush=False)
        store.delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_zombie_stops_publishing_once_it_knows(real_url, worker):
    """5. After a take-over the earlier process knows it is a zombie (health says so) and sends
    nothing more: its reports were all refused and dead-lettered with their payloads (118-145 in 4 s)."""
    store = redisync.connect(real_url, run=f"faults-zombie-quiet-{worker}-{os.getpid()}")
    first, second = Cumulative(), Cumulative()
    a = new_syncer(store, 0, [first], worker=worker, publish_every_steps=1, poll_every_s=0.05).start()
    b = new_syncer(
        redisync.connect(real_url, run=store.run), 0, [second], worker=worker, publish_every_steps=1, take_over=True
    ).start()
    try:
        _train(second, b, 3)
        assert b.wait_synced(timeout=10)
        _train(first, a, 1)
        assert wait_for(lambda: not a.health()["ok"], timeout=10)  # it knows
        known = store.redis.xlen(store.keys.dead_letters)
        for _ in range(40):  # it keeps training, a publish due every step
            _train(first, a, 1)
            time.sleep(0.05)
        assert store.redis.xlen(store.keys.dead_letters) == known  # nothing more sent
        assert not a.health()["ok"]
        assert "later process claimed shard 0" in a.health()["error"]
        assert a.metrics()["redisync/zombie_dropped"] > 0  # what it did not send, counted
    finally:
        a.stop(flush=False)
        b.stop(flush=False)
        store.delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_second_process_with_a_live_shard_id_is_refused_at_start(real_url, worker):
    """10. Two collectors started with one shard id: the second start() refuses, typed, naming the
    shard and REDISYNC_SHARD; once the first has stopped, the id is free at once (the first holds a
    60 s lease: a start that had to wait it out would be refused, as the second one was)."""
    store = redisync.connect(real_url, run=f"faults-in-use-{worker}-{os.getpid()}")
    a = new_syncer(store, 4, [Cumulative()], worker=worker, lease_s=60).start()
    try:
        with pytest.raises(redisync.errors.ShardInUse, match=r"shard 4 is held by a live process.*REDISYNC_SHARD"):
            new_syncer(redisync.connect(real_url, run=store.run), 4, [Cumulative()], worker=worker).start()
        assert a.health()["ok"]
        a.stop()
        b = new_syncer(redisync.connect(real_url, run=store.run), 4, [Cumulative()], worker=worker).start()
        assert b.health()["ok"]
        b.stop()
    finally:
        a.stop(flush=False)
        store.delete()


def test_a_crashed_holders_lease_runs_out_and_its_restart_claims_the_shard(real_url):
    """A fresh restart after SIGKILL (no take-over, no resume) waits out the dead holder's lease."""
    run = f"faults-lease-{os.getpid()}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import redisync
        from redisync.collector.workers import new_syncer
        from tests.collector.test_sidecar import Cumulative
        new_syncer(redisync.connect({real_url!r}, run={run!r}), 5, [Cumulative()], worker="thread").start()
        print("started", flush=True)
        time.sleep(60)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "started"
        holder.kill()
        holder.wait()
        t = time.monotonic()
        restarted = new_syncer(
            redisync.connect(real_url, run=run), 5, [Cumulative()], worker="thread", start_timeout_s=10
        ).start()
        assert time.monotonic() - t < 8
        assert restarted.health()["ok"]
        restarted.stop()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        redisync.connect(real_url, run=run).delete()


def test_wait_synced_covers_a_report_that_fell_due_while_the_sidecar_was_busy(real_url):
    """11. The soak's lost reports: on_step() skips the hand-over while the sidecar is still sending
    the previous report; the last steps' report must still be published before wait_synced() says
    so (as the thread worker has it pending)."""
    with _sidecar_through_a_proxy(real_url, "owed") as (store, proxy, term, syncer):
        proxy.hold = 1
        _train(term, syncer, 1)
        assert wait_for(lambda: len(proxy.held) == 1, timeout=10)  # the sidecar is busy with count 1
        _train(term, syncer, 6)  # each falls due while it is busy
        proxy.release()
        assert syncer.wait_synced(timeout=10)
        assert _count(store) == 7


def test_a_sidecar_that_cannot_start_shows_in_health_at_once(real_url, monkeypatch):
    """8. A sidecar that exits before it serves (here: an interpreter that cannot run it) is not a
    silent restart loop: health() says so when start() returns."""
    store = redisync.connect(real_url, run=f"faults-no-start-{os.getpid()}")
    monkeypatch.setattr(sys, "executable", shutil.which("false"))
    syncer = new_syncer(store, 0, [Cumulative()], worker="process").start()
    try:
        health = syncer.health()
        assert not health["ok"]
        assert "sidecar: could not start" in health["error"]
    finally:
        syncer.stop(flush=False, timeout=1.0)
        store.delete()


def test_an_option_that_cannot_reach_a_sidecar_is_refused_at_construction(real_url):
    """2. A redis-py option that cannot be pickled (a credential provider holding a lock) killed the
    starter thread after the sidecar was spawned: health() said ok and nothing reached the store."""
    from redisync import errors

    class Credentials(redis.CredentialProvider):
        def __init__(self):
            self.lock = threading.Lock()

        def get_credentials(self):
            return ("default", "")

    store = redisync.connect(real_url, run=f"faults-unpicklable-{os.getpid()}", credential_provider=Credentials())
    with pytest.raises(errors.ConfigurationError, match=r"option credential_provider=.* cannot reach the sidecar"):
        new_syncer(store, 0, [Cumulative()], worker="process")
    syncer = new_syncer(store, 0, [Cumulative()], worker="thread").start()  # the thread worker takes it as it is
    try:
        assert syncer.flush()
        assert syncer.wait_synced(timeout=10)
        assert syncer.health()["ok"]
    finally:
        syncer.stop()
        store.delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_worker_that_fails_to_start_is_never_silent(real_url, monkeypatch, worker):
    """2. Any other exception in the worker's start: health() says so at once, flush() and
    wait_synced() return False (at once), stop() returns."""
    from redisync.collector.sidecar import SidecarWorker
    from redisync.collector.thread_worker import ThreadWorker

    def broken(self):
        raise RuntimeError("no worker today")

    monkeypatch.setattr(SidecarWorker if worker == "process" else ThreadWorker, "start", broken)
    store = redisync.connect(real_url, run=f"faults-no-worker-{worker}-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(store, 0, [term], worker=worker).start()
    try:
        health = syncer.health()
        assert not health["ok"]
        assert "the worker could not start: RuntimeError: no worker today" in health["error"]
        _train(term, syncer, 3)
        assert syncer.flush() is False
        started = time.monotonic()
        assert syncer.wait_synced(timeout=30) is False
        assert time.monotonic() - started < 5  # it knows at once: no 30 s wait
    finally:
        syncer.stop(timeout=1.0)
        store.delete()


def test_a_store_that_lost_the_run_gets_the_holders_lease_back_before_its_new_epoch_counts_as_seen(real_url):
    """The store loses everything and another collector registers the run again first: the holder
    sees the new epoch without a RunNotFound, so nothing re-registered it. Its lease must be back
    by the time it has pulled the new epoch (it used to wait for the next renewal, up to a fifth of a
    lease, while a second process with its shard id could take the shard). The thread worker, with
    a long lease; the sidecar runs the same worker loop."""
    store = redisync.connect(real_url, run=f"faults-lease-lost-{os.getpid()}")
    seen = Versions()
    holder = new_syncer(
        store, 0, [seen], worker="thread", poll_every_s=0.05, lease_s=60.0
    ).start()  # renewed every 12 s
    other = None

    def applied() -> tuple[str, int] | None:
        holder.at_reset_boundary()
        return seen.applied[-1] if seen.applied else None

    try:
        assert wait_for(lambda: applied() is not None, timeout=10)
        store.delete()  # the store lost the run (a restart without persistence, a FLUSHALL)
        other = new_syncer(redisync.connect(real_url, run=store.run), 1, [Cumulative()], worker="thread").start()
        epoch = store.fleet().epoch
        assert wait_for(lambda: (applied() or ("", 0))[0] == epoch, timeout=10)
        with pytest.raises(redisync.errors.ShardInUse, match="shard 0 is held"):
            store.claim(0, take_over=False)
    finally:
        holder.stop(flush=False)
        if other is not None:
            other.stop(flush=False)
        store.delete()


def test_stop_returns_within_its_timeout_when_the_store_hangs_and_the_sidecar_died(real_url):
    """6. The monitor waits for a respawned sidecar that cannot serve (every request to the store is
    held); stop(timeout=1) no longer waits for it (it took STARTUP_S, 10 s), and the sidecar it could
    not stop is killed, not left behind."""
    with _sidecar_through_a_proxy(real_url, "hung-stop") as (_store, proxy, term, syncer):
        _train(term, syncer, 3)
        syncer.flush()
        assert syncer.wait_synced(timeout=10)
        proxy.match, proxy.hold = b"", 10**9  # from now on the store answers nothing
        pid = syncer.worker.sidecar_pid
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: syncer.worker.sidecar_pid not in (None, pid), timeout=10)  # the monitor respawned one
        successor = syncer.worker.sidecar_pid
        started = time.monotonic()
        syncer.stop(flush=True, timeout=1.0)
        took = time.monotonic() - started
        assert took < 1.0 + 2.0, f"stop(timeout=1) took {took:.1f} s"  # the bound: a kill and a wait after the deadline
        assert not _alive(successor)


_SIGNALLED = """
import os, signal, sys
sys.path.insert(0, {root!r})
import redisync
from redisync.collector.workers import new_syncer
from tests.collector.test_sidecar import Cumulative

store = redisync.connect({url!r}, run={run!r})
term = Cumulative()
syncer = new_syncer(store, 0, [term], worker={worker!r}, publish_every_steps=1).start()
calls = 0

def handler(sig, frame):  # what a trainer's checkpoint-and-exit handler does
    global calls
    calls += 1
    if calls < {flushes}:
        syncer.flush()
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    syncer.stop(timeout=3.0)
    print("stopped", calls, term.count, flush=True)
    os._exit(0)

signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
while True:  # the hot path, a publish due every step
    term.step()
    syncer.on_step()
"""


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_flush_and_stop_from_a_signal_handler_never_hang(real_url, worker):
    """1. A handler calling flush() (hundreds of times, landing anywhere in on_step()) and then stop()
    completes: the thread worker's hand-over took a lock and set an Event whose lock a handler that
    interrupted it waited on for ever. The last report stop() took is in the store."""
    run = f"faults-signals-{worker}-{os.getpid()}"
    code = _SIGNALLED.format(
        root=str(Path(__file__).resolve().parents[2]), url=real_url, run=run, worker=worker, flushes=400
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {worker} worker hung under a signal handler's flush()/stop()")
    finally:
        store = redisync.connect(real_url, run=run)
    try:
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.startswith("stopped"), done.stderr[-2000:]
        calls, count = int(done.stdout.split()[1]), float(done.stdout.split()[2])
        assert calls == 400
        stored = _count(store)
        # the thread worker publishes the report stop() took; the sidecar too, unless the handler
        # interrupted a hand-over (then the one before it, and it says so)
        assert stored == count or (worker == "process" and "during a hand-over" in done.stderr and stored == count - 1)
    finally:
        store.delete()


def test_stop_publishes_the_last_report_when_the_sidecar_is_starved(real_url):
    """10. A sidecar that cannot run (SIGSTOPped: the extreme of a starved process on an overloaded
    machine) missed stop()'s timeout and the last report was lost; now the collector publishes it
    itself in its share of the timeout, and stop() says whether the last report reached the store."""
    store = redisync.connect(real_url, run=f"faults-starved-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600).start()
    try:
        _train(term, syncer, 5)
        syncer.flush()
        assert syncer.wait_synced(timeout=10)
        assert _count(store) == 5
        _train(term, syncer, 7)
        pid = syncer.worker.sidecar_pid
        assert wait_for(
            lambda: syncer.at_reset_boundary() or syncer.metrics()["redisync/fleet_version"] > 0, timeout=10
        )
        handed = int(syncer.metrics()["redisync/fleet_version"])
        os.kill(pid, signal.SIGSTOP)
        assert syncer.stop(flush=True, timeout=3.0) is True
        assert _count(store) == 12
        # the report says what the shard had seen (it read 0: `watch` showed it thousands of versions behind)
        assert int(store.redis.hget(store.keys.shards, "0:seen")) == handed
        assert not _alive(pid)  # killed, not left stopped
        # and the collector gave the shard's lease up after its own publish: a clean stop, not a pause
        assert store.redis.hget(store.keys.shards, "0:alive_until_us") == b"-1"
    finally:
        syncer.stop(flush=False)
        store.delete()


def _busy() -> None:
    while True:
        pass


@pytest.mark.integration  # a machine's worth of load of its own: the full tier's
@pytest.mark.parametrize("worker", ["thread", "process"])
def test_the_last_report_survives_a_loaded_machine(real_url, worker, caplog):
    """10. Every core kept busy by five processes each (load ~10 on 2 cores): stop() publishes the
    last report of four collectors' syncers and says so, and each sidecar does it itself and exits
    cleanly, not killed at the end of the stop timeout (at nice 10 every one was: it needed ~5.5 s)."""
    import logging
    import multiprocessing

    caplog.set_level(logging.INFO, logger="redisync.collector.sidecar")

    busy = [
        multiprocessing.get_context("fork").Process(target=_busy, daemon=True) for _ in range(5 * (os.cpu_count() or 2))
    ]
    stores = [redisync.connect(real_url, run=f"faults-loaded-{worker}-{i}-{os.getpid()}") for i in range(4)]
    terms = [Cumulative() for _ in stores]
    syncers = [
        new_syncer(s, 0, [t], worker=worker, publish_every_steps=1000, publish_every_s=3600).start()
        for s, t in zip(stores, terms, strict=False)
    ]
    try:
        for p in busy:
            p.start()
        for t, s in zip(terms, syncers, strict=False):
            _train(t, s, 9)
        assert all(s.stop(flush=True, timeout=5.0) for s in syncers)
        assert [_count(s) for s in stores] == [9, 9, 9, 9]
        assert [
            r.getMessage() for r in caplog.records if "killed" in r.getMessage() or "itself" in r.getMessage()
        ] == []
    finally:
        for p in busy:
            p.kill()
        for s in syncers:
            s.stop(flush=False)
        for s in stores:
            s.delete()


def test_a_store_that_fails_right_after_the_registration_does_not_fail_the_sidecars_start(real_url, monkeypatch):
    """The sidecar's start reads the run's limits after registering; a store restarting at that moment
    (or one that lost the run) ended the start for good ("the worker could not start", every report
    dropped until the collector restarted): a soak on a loaded machine met it. Now the defaults stand
    until the monitor reads the run's, and the collector's reports reach the store meanwhile."""
    from redisync.store.client import Store
    from redisync.store.schema import Limits

    store = redisync.connect(real_url, run=f"faults-limits-{os.getpid()}")
    store.register(redisync.Schema.of(Cumulative().schema_entries()), Limits(max_report_bytes=4096))
    real_limits, failures = Store.limits, [3]

    def limits(self):
        if failures[0] > 0:
            failures[0] -= 1
            raise redisync.errors.ConnectionUnavailable("the store is restarting (injected)")
        return real_limits(self)

    monkeypatch.setattr(Store, "limits", limits)
    term = Cumulative()
    syncer = new_syncer(redisync.connect(real_url, run=store.run), 0, [term], worker="process")
    try:
        syncer.start()
        assert syncer.start_failed is None
        _train(term, syncer, 3)
        assert syncer.flush()
        assert syncer.wait_synced(timeout=20)
        assert _count(store) == 3.0
        assert wait_for(lambda: syncer.worker._limits.max_report_bytes == 4096, timeout=20)  # the run's, read later
        assert syncer.health()["ok"]
    finally:
        syncer.stop(flush=False)
        store.delete()


@pytest.mark.integration  # a sidecar whose start takes 3 s
def test_a_sidecar_still_starting_on_a_loaded_machine_is_not_killed_as_hung(real_url, monkeypatch, tmp_path):
    """A sidecar whose start takes longer than a hang (its interpreter slow to start, as on a machine
    at load ~30) is waited for until its own start deadline, not killed by the heartbeat clock that
    only a serving sidecar beats ("could not start (exit code -9)" three times in a full tier)."""
    from redisync.collector import sidecar_supervisor

    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\nsleep 3\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setattr(sidecar_supervisor, "HUNG_AFTER_S", 1.0)
    monkeypatch.setattr(sidecar_supervisor, "STARTUP_S", 0.5)  # start() goes on without it
    monkeypatch.setattr(sys, "executable", str(slow))
    store = redisync.connect(real_url, run=f"faults-slow-start-{os.getpid()}")
    syncer = new_syncer(store, 0, [Cumulative()], worker="process").start()
    try:
        assert wait_for(lambda: _serving(syncer), timeout=30)
        pid = syncer.worker.sidecar_pid
        time.sleep(2.0)  # past a hang's length while serving: its heartbeat keeps it
        assert syncer.worker.sidecar_pid == pid
        health = syncer.health()
        assert "could not start" not in str(health.get("error"))
        assert health["ok"], health
        assert syncer.metrics()["redisync/sidecar_restarts"] == 0
    finally:
        syncer.stop(flush=False, timeout=5.0)
        store.delete()
