"""The process worker: the mailbox never hands over a torn message, the sidecar dies with its
collector, a crashed sidecar is restarted within the same life of the shard, bad input is refused
without stopping the collector."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import redisync
from redisync import errors, merge
from redisync.collector.mailbox import OUTBOX, Mailbox, MailboxFull
from redisync.collector.workers import new_syncer

from ..conftest import REAL_URL
from ..support import wait_for

KEY = "t/stats"


class Cumulative:
    """A merge term whose report is the running count and sum of what the shard saw."""

    def __init__(self, n: int = 8):
        self.count, self.total, self.fleet = 0.0, np.zeros(n), None
        self.n = n

    def step(self, x: float = 1.0) -> None:
        self.count += 1
        self.total += x

    def schema_entries(self):
        return {KEY: merge(self.n, lifecycle="history")}

    def report_shard_state(self):
        return {KEY: {"count": self.count, "sum": self.total.copy()}}

    def apply_shard_state(self, fleet) -> None:
        self.fleet = fleet.keys[KEY].parts()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, only not reaped yet
    except FileNotFoundError:
        return False


def _writer(name: str, sizes, n: int) -> None:
    box = Mailbox.attach(name, sizes)
    for i in range(1, n + 1):
        box.write(OUTBOX, np.full(2048, float(i)))
    box.close()


def test_a_reader_never_gets_a_torn_message():
    """A reader racing a writer in another process sees whole messages only, in order, and the last one."""
    box = Mailbox.create(1 << 16, 1024)
    writer = mp.get_context("spawn").Process(target=_writer, args=(box.name, box.sizes, 3000))
    writer.start()
    seen, seq = [], 0
    try:
        while writer.is_alive() or not seen or seen[-1] < 3000:
            got = box.read(OUTBOX, seq)
            if got is None:
                if not writer.is_alive() and box.read(OUTBOX, seq) is None:
                    break
                continue
            seq, message = got
            assert np.all(message == message[0]), "a message mixed two writes"
            seen.append(message[0])
    finally:
        writer.join()
        box.close()
    assert seen == sorted(seen)
    assert seen[-1] == 3000


def test_a_message_larger_than_its_slot_is_refused():
    """A message that does not fit its slot is refused (MailboxFull) and leaves nothing half-written."""
    box = Mailbox.create(256, 256)
    try:
        with pytest.raises(MailboxFull, match="does not fit"):
            box.write(OUTBOX, np.zeros(1000))
        assert box.read(OUTBOX, 0) is None  # nothing half-written
    finally:
        box.close()


def test_the_process_worker_needs_a_server_and_the_worker_must_exist():
    """The sidecar cannot reach an embedded store, and an unknown worker name is refused: both typed, at construction."""
    with pytest.raises(errors.ConfigurationError, match="needs a Redis URL"):
        new_syncer(redisync.connect(None, run="embedded"), 0, [Cumulative()], worker="process")
    with pytest.raises(errors.ConfigurationError, match="worker must be one of"):
        new_syncer(redisync.connect(None, run="embedded"), 0, [Cumulative()], worker="fiber")


def test_the_sidecar_is_only_used_where_stores_stay_in_order(monkeypatch):
    """Its seqlocks have no fences: on a CPU that may reorder stores (aarch64) auto takes the thread."""
    import platform

    from redisync.collector.sidecar import SidecarWorker
    from redisync.collector.thread_worker import ThreadWorker

    store = redisync.connect(REAL_URL, run="never-started")  # (never connects)
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert type(new_syncer(store, 0, [Cumulative()]).worker) is SidecarWorker
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert type(new_syncer(store, 0, [Cumulative()]).worker) is ThreadWorker
    with pytest.raises(errors.ConfigurationError, match="keeps stores in order"):
        new_syncer(store, 0, [Cumulative()], worker="process")


def test_a_killed_sidecar_is_restarted_within_the_same_life(real_url):
    """A SIGKILLed sidecar is replaced by the collector's monitor with the same incarnation (a sidecar's
    death is not a new life of the shard), and the fleet count stays the collector's."""
    store = redisync.connect(real_url, run=f"sidecar-restart-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(store, 3, [term], worker="process", publish_every_steps=1, poll_every_s=0.05).start()
    try:
        incarnation = syncer.shard.incarnation
        for _ in range(20):
            term.step()
            syncer.on_step()
        assert syncer.wait_synced(timeout=10)
        first = syncer.worker.sidecar_pid
        os.kill(first, signal.SIGKILL)
        for _ in range(20):  # the collector trains on while its sidecar is gone
            term.step(2.0)
            syncer.on_step()
            syncer.at_reset_boundary()
        assert wait_for(lambda: syncer.worker.sidecar_pid != first and syncer.stats["sidecar_restarts"] == 1)
        syncer.flush()
        assert syncer.wait_synced(store.fleet().fleet_version, timeout=10)
        assert syncer.at_reset_boundary() or term.fleet is not None
        # the shard's slot is its latest cumulative report, folded under the same incarnation, nothing refused
        parts = store.fleet().keys[KEY].parts()
        assert float(parts["count"]) == term.count == 40
        np.testing.assert_array_equal(parts["sum"], term.total)
        assert int(store.key_info(KEY)["slot:3:incarnation"]) == incarnation
        assert store.dead_letters() == []
        assert syncer.stats["rejected"] == 0
    finally:
        syncer.stop(flush=False)
        store.delete()


SHM_PREFIXES = ("redisync", "psm_")  # what a redisync block, or multiprocessing's SharedMemory, would be named


@pytest.mark.extras("torch")
def test_the_sidecar_and_the_shared_memory_die_with_the_collectors_process_group(real_url, tmp_path):
    """SIGKILL of the whole group (the resource tracker dies too): the sidecar exits and nothing is
    left in /dev/shm of ours (the blocks are anonymous memory files; another process's files there are not ours)."""
    run = f"sidecar-orphan-{os.getpid()}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        import redisync
        from redisync.collector.workers import new_syncer
        from redisync.terms.torch import AdaptiveMotionSampler
        from tests.collector.test_sidecar import Cumulative
        terms = [Cumulative(), AdaptiveMotionSampler(500, 0.02)]
        syncer = new_syncer(redisync.connect({real_url!r}, run={run!r}), 0, terms, worker="process").start()
        layout = syncer.worker._shared.layout()
        shared = [layout["control"], layout["staging"][0]] + [name for name, _ in layout["blocks"]]
        print(syncer.worker.sidecar_pid, syncer.worker.mailbox.name, *shared, flush=True)
        time.sleep(60)
    """)
    before = set(os.listdir("/dev/shm"))
    collector = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        pid, *blocks = collector.stdout.readline().split()
        pid = int(pid)
        assert len(blocks) == 4
        assert all(os.path.exists(b) for b in blocks)
        assert _alive(pid)
        os.killpg(collector.pid, signal.SIGKILL)
        collector.wait()
        assert wait_for(lambda: not _alive(int(pid)), timeout=5), "the sidecar outlived its collector"
        assert not [b for b in blocks if os.path.exists(b)], "a block's name outlived every process that held it"
        # scoped to names of ours: other processes on a shared machine create and remove their own
        # (multiprocessing's sem.mp-*), which say nothing of this collector
        ours = {n for n in set(os.listdir("/dev/shm")) - before if n.startswith(SHM_PREFIXES)}
        assert ours == set(), "shared memory outlived every process that held it"
    finally:
        collector.kill()
        collector.wait()
        collector.stdout.close()
        redisync.connect(real_url, run=run).delete()


def test_stop_publishes_the_last_report_and_frees_everything(real_url):
    """stop() publishes a report no cadence made due, ends the sidecar, frees the shared memory, and
    the counters outlive the sidecar."""
    store = redisync.connect(real_url, run=f"sidecar-stop-{os.getpid()}")
    term = Cumulative()
    # no publish falls due by steps or by time (a loaded machine can take a second over these steps)
    syncer = new_syncer(store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600).start()
    try:
        for _ in range(7):
            term.step()
            syncer.on_step()  # no publish is due yet: stop() hands the report over
        pid, shm = syncer.worker.sidecar_pid, syncer.worker.mailbox.name
        syncer.stop(flush=True)
        assert float(store.fleet().keys[KEY].parts()["count"]) == 7
        assert not _alive(pid)
        assert not os.path.exists(shm)
        assert syncer.metrics()["redisync/publishes"] == 1  # the last counters outlive the sidecar
    finally:
        store.delete()


def test_a_report_too_large_for_the_mailbox_is_refused_and_training_goes_on(real_url):
    """A report of the wrong shape is refused on the collector's side, typed in health(), without
    raising on the hot path and without reaching the mailbox."""
    store = redisync.connect(real_url, run=f"sidecar-full-{os.getpid()}")

    class Oversized(Cumulative):
        def report_shard_state(self):
            return {KEY: {"count": self.count, "sum": np.zeros(1_000_000)}}  # not the declared shape

    term = Oversized()
    syncer = new_syncer(store, 0, [term], worker="process", publish_every_steps=1).start()
    try:
        term.step()
        syncer.on_step()  # refused on the collector's side, without raising, as the thread worker refuses it
        assert syncer.stats["rejected_before_sending"] == 1
        assert syncer.stats["mailbox_overflows"] == 0
        assert "[shape]" in syncer.health()["error"]
    finally:
        syncer.stop(flush=False)
        store.delete()


def _never(*_):
    raise AssertionError("the process worker built a shared term's report on the collector")


def _shared_terms(shard: int):
    import torch

    from redisync.terms.torch import AdaptiveMotionSampler, SyncedEmpiricalNormalization

    sampler = AdaptiveMotionSampler(500, 0.02, mode="pooled", shard_id=shard)
    norm = SyncedEmpiricalNormalization(4, mode="pooled")
    for term in (sampler, norm):
        term.report_shard_state = _never  # shared: the sidecar reads the buffers, the hot path never builds a report
    return sampler, norm, torch.Generator().manual_seed(shard)


def _train(sampler, norm, g, syncer, steps: int) -> list:
    import torch

    seen = []
    for _ in range(steps):
        sampler.record_failures(torch.randint(0, 500, (64,), generator=g), torch.rand(64, generator=g) < 0.3)
        sampler.step()
        x = torch.randn(16, 4, generator=g, dtype=torch.float64) * 3 + 1
        norm.update(x)
        seen.append(x)
        syncer.on_step()
        syncer.at_reset_boundary()
    return seen


@pytest.mark.extras("torch")
def test_shared_terms_are_read_by_the_sidecar_and_pooled_exactly(real_url):
    """Two collectors whose sampler and normaliser share their state with their sidecars (neither on
    the copy path): the store holds each shard's buffers exactly, each sampler samples from both
    shards' failures, and each normaliser's pooled moments are those of every sample together."""
    import torch

    store = redisync.connect(real_url, run=f"sidecar-shared-{os.getpid()}")
    fleets = [_shared_terms(shard) for shard in (0, 1)]
    syncers = [
        new_syncer(store, shard, [s, n], worker="process", publish_every_steps=1, poll_every_s=0.05).start()
        for shard, (s, n, _) in enumerate(fleets)
    ]
    try:
        assert all(sy.reporting == [] and sy.worker._handed == [] for sy in syncers)  # both terms shared, both ways
        data = [_train(s, n, g, sy, 40) for (s, n, g), sy in zip(fleets, syncers, strict=False)]
        for sy in syncers:
            sy.flush()
        version = store.fleet().fleet_version
        assert all(sy.wait_synced(version, timeout=10) for sy in syncers)
        version = store.fleet().fleet_version
        assert all(sy.wait_synced(version, timeout=10) for sy in syncers)
        for sy in syncers:
            sy.at_reset_boundary()
        # the store holds each shard's own buffers exactly, as the sidecar copied them
        for shard in range(len(fleets)):
            info = store.key_info("motion/bin_failed")
            assert int(info[f"slot:{shard}:incarnation"]) == syncers[shard].shard.incarnation
        fleet = store.fleet().keys
        own = [s.bin_failed_count.to(torch.float64).numpy() for s, _, _ in fleets]
        np.testing.assert_array_equal(fleet["motion/bin_failed"].parts()["sum"], own[0] + own[1])
        # own substitution through the staged fleet: the others' EMA plus my own, for each shard
        for shard, (s, n, _) in enumerate(fleets):
            np.testing.assert_allclose(s.sampling_ema().numpy(), own[0] + own[1], rtol=1e-12)
            assert s.fleet_version == syncers[shard].metrics()["redisync/fleet_version"] > 0
            mean, var, count = n.pooled_moments()
            pooled = torch.cat(data[0] + data[1])
            assert count == pooled.shape[0] == 2 * 40 * 16
            torch.testing.assert_close(mean, pooled.mean(0))
            torch.testing.assert_close(var, pooled.var(0, unbiased=False))
        assert store.dead_letters() == []
    finally:
        for sy in syncers:
            sy.stop(flush=False)
        store.delete()


def test_a_replaced_sidecars_counters_carry_on_in_the_collectors_stats(real_url):
    """A sidecar killed after 10 publishes: its successor's counters add to its own, so the
    collector's counters (metrics(), the soak's summary) never fall back to zero."""
    store = redisync.connect(real_url, run=f"sidecar-counters-{os.getpid()}")
    term = Cumulative()
    syncer = new_syncer(store, 3, [term], worker="process", publish_every_steps=1, poll_every_s=0.05).start()

    def folded() -> float:
        keys = store.fleet().keys
        return float(keys[KEY].parts()["count"]) if KEY in keys else 0.0

    def sent() -> int:  # the reports the store answered for (a retried one found folded is a duplicate)
        return syncer.stats["publishes"] + syncer.stats["duplicates"]

    try:
        for _ in range(10):  # each report folded before the next is handed over
            term.step()
            syncer.on_step()
            syncer.flush()
            assert wait_for(lambda: folded() == term.count)
        assert wait_for(lambda: sent() >= 10)  # as the sidecar reported them (a flushed copy may add one)
        before = sent()
        first = syncer.worker.sidecar_pid
        os.kill(first, signal.SIGKILL)
        assert wait_for(lambda: syncer.worker.sidecar_pid != first and syncer.stats["sidecar_restarts"] == 1)
        term.step()
        syncer.on_step()
        syncer.flush()
        assert wait_for(lambda: folded() == term.count == 11)
        assert wait_for(lambda: sent() > before), (before, syncer.stats)  # the first sidecar's, and the second's
    finally:
        syncer.stop(flush=False)
        store.delete()


@pytest.mark.extras("torch")
def test_a_restarted_sidecar_reads_and_stages_the_same_shared_memory(real_url):
    """A sidecar SIGKILLed while shared terms train is replaced; its successor reads and stages the
    same shared buffers, and the pooled statistics stay exact."""
    import torch

    store = redisync.connect(real_url, run=f"sidecar-shared-restart-{os.getpid()}")
    sampler, norm, g = _shared_terms(0)
    syncer = new_syncer(store, 0, [sampler, norm], worker="process", publish_every_steps=1, poll_every_s=0.05).start()
    other = store.shard(1)
    try:
        _train(sampler, norm, g, syncer, 10)
        first = syncer.worker.sidecar_pid
        os.kill(first, signal.SIGKILL)
        _train(sampler, norm, g, syncer, 10)  # training goes on while the sidecar is gone
        assert wait_for(lambda: syncer.worker.sidecar_pid != first and syncer.stats["sidecar_restarts"] == 1)
        other.publish({"motion/bin_failed": {"count": 1.0, "sum": np.full(sampler.bin_count, 0.25)}})
        syncer.flush()
        assert syncer.wait_synced(store.fleet().fleet_version, timeout=10)
        assert syncer.at_reset_boundary()
        # the new sidecar read the same buffers (the slot is the EMA of all 20 steps) and staged the other's 0.25
        own = sampler.bin_failed_count.to(torch.float64).numpy()
        fleet_sum = store.fleet().keys["motion/bin_failed"].parts()["sum"]
        np.testing.assert_allclose(fleet_sum, own + 0.25, rtol=1e-12)
        np.testing.assert_allclose(sampler.sampling_ema().numpy(), own + 0.25, rtol=1e-12)
        assert float(store.fleet().keys["obs/norm"].parts()["count"]) == 20 * 16
    finally:
        syncer.stop(flush=False)
        store.delete()


@pytest.mark.extras("torch")
def test_after_stop_a_shared_term_works_on_in_memory_of_its_own(real_url):
    """After stop() the shared segments are gone and a shared term keeps working on private memory."""
    import torch

    store = redisync.connect(real_url, run=f"sidecar-shared-stop-{os.getpid()}")
    sampler, norm, g = _shared_terms(0)
    syncer = new_syncer(
        store, 0, [sampler, norm], worker="process", publish_every_steps=1000, publish_every_s=3600
    ).start()
    try:
        names = [syncer.worker._shared._control.name, syncer.worker._shared._staging_shm.name] + [
            shm.name for shm, _ in syncer.worker._shared._blocks
        ]
        assert all(os.path.exists(name) for name in names)
        _train(sampler, norm, g, syncer, 5)
        syncer.stop(flush=True)  # the last shared state is published on the way out
        np.testing.assert_array_equal(
            store.fleet().keys["motion/bin_failed"].parts()["sum"], sampler.bin_failed_count.to(torch.float64).numpy()
        )
        assert float(store.fleet().keys["obs/norm"].parts()["count"]) == 5 * 16
        assert not any(os.path.exists(name) for name in names)
        before = sampler.bin_failed_count.clone()
        sampler.record_failures(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.bool))
        sampler.step()  # still its own memory: no error, and it moves
        norm.update(torch.ones(3, 4))
        assert not torch.equal(before, sampler.bin_failed_count)
        assert float(norm._own[0, 0]) == 5 * 16 + 3
        assert sampler.sample(8).shape == (8,)
    finally:
        store.delete()


@pytest.mark.extras("torch")
def test_a_learners_normaliser_reaches_collectors_through_shared_memory(real_url):
    """A learner's normaliser (the writer) reaches a collector's copy through both sidecars' shared
    memory, with neither term on the copy path."""
    import torch

    from redisync.terms.torch import SyncedEmpiricalNormalization

    store = redisync.connect(real_url, run=f"sidecar-learner-{os.getpid()}")
    learner = SyncedEmpiricalNormalization(3, mode="learner", writer=True)
    collector = SyncedEmpiricalNormalization(3, mode="learner")
    writer = new_syncer(store, 0, [learner], worker="process").start()
    reader = new_syncer(store, 1, [collector], worker="process", poll_every_s=0.05).start()
    try:
        assert reader.worker._handed == []
        assert reader.reporting == []
        assert writer.reporting == [learner]
        assert not reader.at_reset_boundary() or float(collector.count) == 0  # nothing published: untouched
        torch.testing.assert_close(collector.std, torch.ones(3))
        learner.update(torch.randn(500, 3, generator=torch.Generator().manual_seed(0)) * 2 + 5)
        writer.flush()
        assert writer.wait_synced(timeout=10)
        assert reader.wait_synced(store.fleet().fleet_version, timeout=10)
        assert reader.at_reset_boundary()
        torch.testing.assert_close(collector.mean, learner.mean)
        torch.testing.assert_close(collector.std, learner.std)
        assert int(collector.count) == int(learner.count) == 500
    finally:
        for s in (writer, reader):
            s.stop(flush=False)
        store.delete()
