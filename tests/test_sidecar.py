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
import time

import numpy as np
import pytest

import redisync
from redisync import errors, merge
from redisync.mailbox import OUTBOX, Mailbox, MailboxFull
from redisync.syncer import Syncer

from .support import wait_for

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
        return {KEY: merge(self.n)}

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
    assert seen == sorted(seen) and seen[-1] == 3000  # only ever newer messages, down to the last one


def test_a_message_larger_than_its_slot_is_refused():
    box = Mailbox.create(256, 256)
    try:
        with pytest.raises(MailboxFull, match="does not fit"):
            box.write(OUTBOX, np.zeros(1000))
        assert box.read(OUTBOX, 0) is None  # nothing half-written
    finally:
        box.close()


def test_the_process_worker_needs_a_server_and_the_worker_must_exist():
    with pytest.raises(errors.ConfigurationError, match="needs a Redis URL"):
        Syncer(redisync.connect(None, run="embedded"), 0, [Cumulative()], worker="process")
    with pytest.raises(errors.ConfigurationError, match="worker must be one of"):
        Syncer(redisync.connect(None, run="embedded"), 0, [Cumulative()], worker="fiber")


def test_a_killed_sidecar_is_restarted_within_the_same_life(real_url):
    store = redisync.connect(real_url, run=f"sidecar-restart-{os.getpid()}")
    term = Cumulative()
    syncer = Syncer(store, 3, [term], worker="process", publish_every_steps=1, poll_every_s=0.05).start()
    try:
        incarnation = syncer.shard.incarnation
        for _ in range(20):
            term.step()
            syncer.on_step()
        assert syncer.wait_synced(timeout=10)
        first = syncer.sidecar_pid
        os.kill(first, signal.SIGKILL)
        for _ in range(20):  # the collector trains on while its sidecar is gone
            term.step(2.0)
            syncer.on_step()
            syncer.at_reset_boundary()
        assert wait_for(lambda: syncer.sidecar_pid != first and syncer.stats["sidecar_restarts"] == 1)
        syncer.flush()
        assert syncer.wait_synced(store.fleet().fleet_version, timeout=10)
        assert syncer.at_reset_boundary() or term.fleet is not None
        # the shard's slot is its latest cumulative report, folded under the same incarnation, nothing refused
        parts = store.fleet().keys[KEY].parts()
        assert float(parts["count"]) == term.count == 40
        np.testing.assert_array_equal(parts["sum"], term.total)
        assert int(store.key_info(KEY)[f"slot:3:incarnation"]) == incarnation
        assert store.dead_letters() == [] and syncer.stats["rejected"] == 0
    finally:
        syncer.stop(flush=False)
        store.delete()


def test_the_sidecar_dies_with_its_collector(real_url, tmp_path):
    run = f"sidecar-orphan-{os.getpid()}"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        import redisync
        from redisync.syncer import Syncer
        from tests.test_sidecar import Cumulative
        syncer = Syncer(redisync.connect({real_url!r}, run={run!r}), 0, [Cumulative()], worker="process").start()
        print(syncer.sidecar_pid, syncer.mailbox.name, flush=True)
        time.sleep(60)
    """)
    collector = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid, shm = collector.stdout.readline().split()
        pid = int(pid)
        assert _alive(pid)
        collector.send_signal(signal.SIGKILL)
        collector.wait()
        assert wait_for(lambda: not _alive(int(pid)), timeout=5), "the sidecar outlived its collector"
        # the collector's resource tracker frees the shared memory it can no longer free itself
        assert wait_for(lambda: not os.path.exists(f"/dev/shm/{shm}"), timeout=5)
    finally:
        collector.kill()
        redisync.connect(real_url, run=run).delete()


def test_stop_publishes_the_last_report_and_frees_everything(real_url):
    store = redisync.connect(real_url, run=f"sidecar-stop-{os.getpid()}")
    term = Cumulative()
    # no publish falls due by steps or by time (a loaded machine can take a second over these steps)
    syncer = Syncer(store, 0, [term], worker="process", publish_every_steps=1000, publish_every_s=3600).start()
    try:
        for _ in range(7):
            term.step()
            syncer.on_step()  # no publish is due yet: stop() hands the report over
        pid, shm = syncer.sidecar_pid, syncer.mailbox.name
        syncer.stop(flush=True)
        assert float(store.fleet().keys[KEY].parts()["count"]) == 7
        assert not _alive(pid) and not os.path.exists(f"/dev/shm/{shm}")
        assert syncer.metrics()["redisync/publishes"] == 1  # the last counters outlive the sidecar
    finally:
        store.delete()


def test_a_report_too_large_for_the_mailbox_is_refused_and_training_goes_on(real_url):
    store = redisync.connect(real_url, run=f"sidecar-full-{os.getpid()}")

    class Oversized(Cumulative):
        def report_shard_state(self):
            return {KEY: {"count": self.count, "sum": np.zeros(1_000_000)}}  # not the declared shape

    term = Oversized()
    syncer = Syncer(store, 0, [term], worker="process", publish_every_steps=1).start()
    try:
        term.step()
        syncer.on_step()  # refused on the collector's side, without raising
        assert syncer.stats["mailbox_overflows"] == 1
        assert "does not fit" in syncer.health()["error"]
    finally:
        syncer.stop(flush=False)
        store.delete()
