"""A model-based test of the process worker's life: hypothesis drives what a collector with a
sidecar lives through, with the sampler and the normaliser on the shared-memory path.

Rules — the events of every process of the fleet: train a shard some steps; SIGKILL its sidecar
before, during (its fold held in flight by a proxy, then delivered late or lost) or after a publish
(the collector starts another on the same shared memory); pause it (SIGSTOP) past its lease and
the state keys' grace while the other collector folds; stop the collector right after its
sidecar died; stop it from a signal handler (flush() calls, then stop(), landing anywhere in the hot
path); restart it with a first sidecar that cannot start; restart the collector fresh or resumed from
a checkpoint, from the main thread or from a short-lived thread; a second process claiming the shard (the first becomes a zombie); fork the
collector and let the child exit; restart the store empty (the sidecars re-seed it) or from its
append-only file with the tail cut while no sidecar runs; and settle (flush, wait, take the fleet
in). The model: per shard the samples its live normaliser saw, the samples retired by earlier lives
since the store last lost its state, and the samplers' own EMAs.

Invariants: after every step, no collector has applied an older version of an epoch after a newer
one; when settled (``wait_synced()`` True), the store holds every live shard's own buffers exactly,
every sampler draws from the sum of the live shards' EMAs (own substitution through the staged
fleet state), and every normaliser pools exactly the live and retired samples — nothing counted
twice, nothing lost; a zombie is not healthy.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import redisync
from redisync.collector.mailbox import SIDECAR_PID, STOP
from redisync.collector.workers import new_syncer
from redisync.terms.torch import AdaptiveMotionSampler, SyncedEmpiricalNormalization

from ..faults import HoldingProxy
from ..servers import RedisProcess
from ..support import wait_for
from .test_sidecar import Cumulative

pytestmark = pytest.mark.integration  # a redis-server of its own, restarted by a rule

SHARDS, FRAMES, ENVS, DIMS = (0, 1), 200, 16, 3
LEASE_S, GRACE_S = 1.0, 0.5  # short, so a pause past both costs a rule two seconds


class Applied(Cumulative):
    """A copy-path term that records the (epoch, version) of every fleet state the collector applied."""

    def __init__(self) -> None:
        super().__init__(1)
        self.applied: list[tuple[str, int]] = []

    def schema_entries(self):
        return {"life/steps": redisync.merge(1, lifecycle="state", lease_grace_s=GRACE_S)}

    def report_shard_state(self):
        return {"life/steps": {"count": 1.0, "sum": self.total.copy()}}

    def apply_shard_state(self, fleet) -> None:
        self.applied.append((fleet.epoch, fleet.fleet_version))


class Collector:
    """One life of a collector process: its terms, its generator and its syncer."""

    def __init__(
        self,
        url: str,
        shard: int,
        seed: int,
        checkpoint: dict | None = None,
        from_thread: bool = False,
        take_over: bool = False,
    ):
        self.sampler = AdaptiveMotionSampler(
            FRAMES, 0.02, mode="pooled", shard_id=shard, lease_grace_s=GRACE_S, rebuild_tol=0.0, dtype=torch.float64
        )
        self.norm = SyncedEmpiricalNormalization(DIMS, mode="pooled")
        if checkpoint is not None:  # the sampler resumes its slot; the normaliser's slot is retired history
            self.sampler.load_state_dict(checkpoint["sampler"])
            self.norm.load_state_dict(checkpoint["norm"])
        self.steps = Applied()
        self.g = torch.Generator().manual_seed(seed)
        self.samples = 0
        self.syncer = new_syncer(
            redisync.connect(url, run="life", socket_timeout=1.0),
            shard,
            [self.sampler, self.norm, self.steps],
            worker="process",
            publish_every_steps=1,
            poll_every_s=0.05,
            retry_every_s=0.1,
            take_over=take_over,
            lease_s=LEASE_S,
        )
        if from_thread:  # the thread that starts it ends at once: the sidecar must not die with it
            starter = threading.Thread(target=self.syncer.start)
            starter.start()
            starter.join()
        else:
            self.syncer.start()

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.sampler.record_failures(
                torch.randint(0, FRAMES, (ENVS,), generator=self.g), torch.rand(ENVS, generator=self.g) < 0.3
            )
            self.sampler.step()
            self.norm.update(torch.randn(ENVS, DIMS, generator=self.g, dtype=torch.float64))
            self.samples += ENVS
            self.steps.step()
            self.syncer.on_step()
            self.syncer.at_reset_boundary()

    def checkpoint(self) -> dict:
        return {
            "sampler": {k: v.clone() for k, v in self.sampler.state_dict().items()},
            "norm": {k: v.clone() for k, v in self.norm.state_dict().items()},
        }


def _serving_sidecar(c: Collector) -> int:
    """The pid of the collector's sidecar once one serves: the last one killed (by a rule that does
    not wait for its successor) may not be replaced yet, and its monitor waits a growing pause."""
    syncer = c.syncer
    assert wait_for(
        lambda: (
            syncer.worker.mailbox.header[SIDECAR_PID] == syncer.worker.sidecar_pid
            and syncer.worker.sidecar.process.poll() is None
        ),
        timeout=15,
    )
    return syncer.worker.sidecar_pid


def _kill_sidecar(c: Collector) -> int:
    """SIGKILL the collector's sidecar once one serves."""
    pid = _serving_sidecar(c)
    os.kill(pid, signal.SIGKILL)
    return pid


class SidecarLife(RuleBasedStateMachine):
    server: RedisProcess
    proxy: HoldingProxy  # in front of the server: holds a fold in flight when a rule asks

    @initialize()
    def start(self) -> None:
        self.store = redisync.connect(self.server.url, run="life")
        self.store.delete()
        self.url = self.proxy.url
        self.collectors = {shard: Collector(self.url, shard, seed=shard) for shard in SHARDS}
        self.retired = 0  # samples of earlier lives, kept as retired history since the store last lost its state
        self.lives = len(SHARDS)
        self.saved: tuple[int, int] | None = None  # (lives, retired) when the append-only file was copied

    def _new_life(
        self, shard: int, checkpoint: dict | None = None, from_thread: bool = False, take_over: bool = False
    ) -> None:
        self.lives += 1
        self.collectors[shard] = Collector(
            self.url, shard, seed=100 * self.lives, checkpoint=checkpoint, from_thread=from_thread, take_over=take_over
        )

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(1, 40))
    def train(self, shard: int, steps: int) -> None:
        self.collectors[shard].train(steps)

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(0, 20))
    def kill_sidecar(self, shard: int, steps: int) -> None:
        c = self.collectors[shard]
        first = _kill_sidecar(c)
        c.train(steps)  # the collector trains on, its view stale for a moment
        assert wait_for(lambda: c.syncer.worker.sidecar_pid != first, timeout=10)

    def _writers(self, key: str) -> set[int]:
        writers = self.store.redis.hget(self.store.keys.key_meta(key), "writers")
        return {int(w) for w in writers.split(b",") if w} if writers else set()

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(0, 10))
    def pause_sidecar_past_its_lease(self, shard: int, steps: int) -> None:
        """SIGSTOP (a swapped-out or debugged process) past its lease and the state keys' grace while
        the other collector trains, so the other's folds drop the paused shard's state slots (its
        history slot stays); its own collector trains on. Then SIGCONT: the sidecar renews its lease
        and its state slots come back."""
        c, other = self.collectors[shard], self.collectors[1 - shard]
        history = self._writers("obs/norm")
        pid = _serving_sidecar(c)
        os.kill(pid, signal.SIGSTOP)
        try:
            c.train(steps)
            past = time.monotonic() + LEASE_S + GRACE_S + 0.5
            while time.monotonic() < past:
                other.train(1)
                time.sleep(0.05)
            other.syncer.flush()
            assert other.syncer.wait_synced(timeout=15)
            for key in ("life/steps", "motion/bin_failed"):  # state keys: the paused shard has left them
                assert self._writers(key) == {1 - shard}, key
            # a history key keeps its slot (one the shard had before the pause; a report already on its
            # way when the sidecar stopped may add one after the look before it)
            assert shard not in history or shard in self._writers("obs/norm")
        finally:
            os.kill(pid, signal.SIGCONT)

    @rule(shard=st.sampled_from(SHARDS), delivered=st.booleans())
    def kill_sidecar_mid_publish(self, shard: int, delivered: bool) -> None:
        """Its fold is on the wire when it dies: it lands late (after the successor started) or never."""
        c = self.collectors[shard]
        self.proxy.hold = 1
        c.train(1)
        held = wait_for(lambda: len(self.proxy.held) == 1, timeout=5)
        self.proxy.hold = 0
        first = _kill_sidecar(c)
        assert wait_for(lambda: c.syncer.worker.sidecar_pid != first, timeout=10)
        if held and delivered:
            time.sleep(0.3)  # the successor has continued the sequence meanwhile
            self.proxy.release()
        else:
            self.proxy.held.clear()

    @rule(shard=st.sampled_from(SHARDS), resume=st.booleans(), from_thread=st.booleans())
    def restart_collector(self, shard: int, resume: bool, from_thread: bool) -> None:
        old = self.collectors[shard]
        checkpoint = old.checkpoint() if resume else None
        old.syncer.stop(flush=True)
        self.retired += old.samples  # its normaliser slot stays as history, resumed or not
        self._new_life(shard, checkpoint, from_thread)

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(1, 10))
    def stop_right_after_the_sidecar_died(self, shard: int, steps: int) -> None:
        """The last report reaches the store whenever the last sidecar died."""
        old = self.collectors[shard]
        old.train(steps)
        _kill_sidecar(old)
        old.syncer.stop(flush=True)
        self.retired += old.samples
        self._new_life(shard)

    @rule(shard=st.sampled_from(SHARDS), flushes=st.integers(1, 30))
    def stop_from_a_signal_handler(self, shard: int, flushes: int) -> None:
        """A trainer's checkpoint-and-exit handler: flush() while the collector trains, then stop(),
        from SIGALRM, landing anywhere in the hot path; the next life starts."""
        old = self.collectors[shard]
        state: dict = {"calls": 0, "published": None}

        def handler(sig, frame) -> None:
            state["calls"] += 1
            if state["calls"] < flushes:
                old.syncer.flush()
                return
            signal.setitimer(signal.ITIMER_REAL, 0)
            state["samples"] = float(old.norm._own[0, 0])  # what its normaliser counted (maybe mid-step)
            state["published"] = old.syncer.stop(flush=True)

        previous = signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
        try:
            deadline = time.monotonic() + 60
            while state["published"] is None:
                assert time.monotonic() < deadline, "stop() from the signal handler never returned"
                old.train(1)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        # its normaliser slot becomes retired history: what stop() published (it says whether that
        # was the last report; if a hand-over was interrupted, the one before it)
        raw = self.store.redis.hget(self.store.keys.key_data("obs/norm"), f"slot:{shard}")
        folded = float(np.frombuffer(raw)[0]) if raw else 0.0
        assert folded == state["samples"] or (not state["published"] and folded < state["samples"])
        self.retired += folded
        self._new_life(shard)

    @rule(shard=st.sampled_from(SHARDS))
    def restart_whose_first_sidecar_cannot_start(self, shard: int) -> None:
        """The next life's first sidecar exits before it serves: health() says so at once; the
        monitor's next start works and the life goes on."""
        old = self.collectors[shard]
        assert old.syncer.stop(flush=True)
        self.retired += old.samples
        real = sys.executable
        sys.executable = shutil.which("false") or "/bin/false"
        try:
            self._new_life(shard)
        finally:
            sys.executable = real
        c = self.collectors[shard]
        assert "sidecar: could not start" in (c.syncer.health()["error"] or "")
        c.train(3)  # the hot path works meanwhile
        assert wait_for(lambda: c.syncer.health()["ok"], timeout=30), c.syncer.health()

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(1, 10))
    def a_second_process_claims_the_shard(self, shard: int, steps: int) -> None:
        """Started with the same shard id: refused while the first lives; told to take over, it
        does, and the earlier process becomes a zombie, and says so."""
        old = self.collectors[shard]
        # after the store lost its state the lease is back with the holder's re-registration (settled)
        self.settle()
        # the holder lives, as the store judges it: its 1 s lease renewed just now (a sidecar starved for a
        # second on a loaded machine lets it lapse, and then the claim is rightly granted: not this rule's case)
        assert wait_for(lambda: self._lease_left_s(shard) >= 0.5, timeout=30), self.store.leases()
        with pytest.raises(redisync.errors.ShardInUse, match=f"shard {shard} is held"):
            Collector(self.url, shard, seed=0)
        old.syncer.flush()
        assert old.syncer.wait_synced(timeout=15)
        folded = old.samples
        self._new_life(shard, take_over=True)  # claims a later incarnation while the old one runs
        old.train(steps)  # refused from now on
        assert wait_for(lambda: "later process claimed" in (old.syncer.health()["error"] or ""), timeout=10), (
            f"a zombie said {old.syncer.health()}"
        )
        old.syncer.stop(flush=False)
        self.retired += folded

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(1, 10))
    def fork_a_child_that_exits(self, shard: int, steps: int) -> None:
        """The child trains its copies and stops its inherited syncer: nothing of it reaches the parent."""
        c = self.collectors[shard]
        # (from a serving sidecar: one killed by the rule before may be between its death and its successor)
        own, sidecar = c.sampler.bin_failed_count.clone(), _serving_sidecar(c)
        pid = os.fork()
        if pid == 0:
            try:
                c.sampler.bin_failed_count.add_(1.0)  # into private memory: the parent must not see it
                for _ in range(steps):
                    c.syncer.on_step()
                c.syncer.flush()
                c.syncer.stop(flush=True)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG) == (0, 0):
            time.sleep(0.02)
        else:
            if time.monotonic() >= deadline:  # a child stuck on a lock another thread held at the fork
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        assert torch.equal(own, c.sampler.bin_failed_count), "the child wrote into its parent's shared buffers"
        assert c.syncer.worker.mailbox is not None, "the child stopped its parent's sidecar"
        assert c.syncer.worker.mailbox.header[STOP] == 0, "the child stopped its parent's sidecar"
        assert c.syncer.worker.sidecar_pid == sidecar
        assert os.path.exists(f"/proc/{sidecar}")

    @rule()
    def restart_store(self) -> None:
        self.server.kill()
        shutil.rmtree(self.server.workdir / "appendonlydir", ignore_errors=True)
        self.server.start()  # empty: the live sidecars re-seed their own slots; retired history is gone
        self.retired, self.saved = 0, None

    @rule()
    def save_append_only_file(self) -> None:
        self.settle()
        shutil.rmtree(self.server.workdir / "aof-saved", ignore_errors=True)
        shutil.copytree(self.server.workdir / "appendonlydir", self.server.workdir / "aof-saved")
        self.saved = (self.lives, self.retired)

    @precondition(lambda self: self.saved is not None and self.saved[0] == self.lives)
    @rule()
    def restart_store_with_its_tail_lost_while_no_sidecar_runs(self) -> None:
        """Every sidecar is SIGKILLed, the server restarts from an older append-only file, and the
        successors start while it is down: none may hand over an older version of the same epoch."""
        for c in self.collectors.values():
            _kill_sidecar(c)
        self.server.kill()
        time.sleep(0.5)
        shutil.rmtree(self.server.workdir / "appendonlydir")
        shutil.copytree(self.server.workdir / "aof-saved", self.server.workdir / "appendonlydir")
        self.server.start()

    @invariant()
    def no_applied_version_goes_back_within_an_epoch(self) -> None:
        for c in getattr(self, "collectors", {}).values():
            c.syncer.at_reset_boundary()
            applied = c.steps.applied
            for (e0, v0), (e1, v1) in itertools.pairwise(applied):
                # the same state again is harmless (a successor's first pull re-hands it); older is not
                assert e1 != e0 or v1 >= v0, f"applied ({e1}, v{v1}) after ({e0}, v{v0})"

    @invariant()
    def no_counter_of_a_collector_goes_back(self) -> None:
        """Its counters (publishes, re-seeds, ...) sum over every sidecar it has run: a sidecar killed
        and replaced does not take its counts with it."""
        seen = getattr(self, "counters", {})
        for c in getattr(self, "collectors", {}).values():
            now, before = c.syncer.stats, seen.get(id(c.syncer), {})
            assert all(now.get(k, 0) >= v for k, v in before.items()), (before, now)
            seen[id(c.syncer)] = now
        self.counters = {id(c.syncer): seen[id(c.syncer)] for c in getattr(self, "collectors", {}).values()}

    def _lease_left_s(self, shard: int) -> float:
        """How long the shard's lease has left, in the run's served clock (negative: lapsed or given up)."""
        reading = self.store.leases()
        return (reading.alive_until_us.get(shard, -1) - reading.served_us) / 1e6

    @rule()
    def settle(self) -> None:
        syncers = [c.syncer for c in self.collectors.values()]
        deadline = time.monotonic() + 30
        while True:
            for s in syncers:
                s.flush()
            assert all(s.wait_synced(timeout=15) for s in syncers)
            final = self.store.fleet().fleet_version
            if all(s.wait_synced(final, timeout=2) for s in syncers) or time.monotonic() > deadline:
                break
        for s in syncers:
            s.at_reset_boundary()
        fleet = self.store.fleet().keys
        owns = {shard: c.sampler.bin_failed_count.numpy().copy() for shard, c in self.collectors.items()}
        total = sum(owns.values())
        np.testing.assert_allclose(fleet["motion/bin_failed"].parts()["sum"], total, rtol=1e-12, atol=1e-300)
        for c in self.collectors.values():
            np.testing.assert_allclose(c.sampler.sampling_ema().numpy(), total, rtol=1e-12, atol=1e-300)
            assert c.norm.pooled_moments()[2] == sum(x.samples for x in self.collectors.values()) + self.retired
        assert (
            float(fleet["obs/norm"].parts()["count"]) == sum(x.samples for x in self.collectors.values()) + self.retired
        )
        assert float(fleet["life/steps"].parts()["sum"][0]) == sum(
            float(x.steps.total[0]) for x in self.collectors.values()
        )
        # refused on purpose: a zombie's reports, and a dead sidecar's fold that landed after its successor's
        assert {d["reason"] for d in self.store.dead_letters()} <= {"stale_incarnation", "seq_rollback"}

    def teardown(self) -> None:
        try:
            if hasattr(self, "collectors"):
                self.settle()  # every life ends settled and checked
        finally:
            for c in getattr(self, "collectors", {}).values():
                c.syncer.stop(flush=False)


def test_a_collector_with_a_sidecar_lives_through_kills_restarts_and_a_lost_store(tmp_path):
    """The life-cycle model's rules (sidecar kills, mid-publish kills, pauses, stops, store restarts)
    in any order: nothing lost, nothing counted twice, no counter goes back."""
    server = RedisProcess(tmp_path, None, "--appendonly", "yes", "--appendfsync", "always").start()
    SidecarLife.server = server
    SidecarLife.proxy = HoldingProxy(server.port, redisync.connect(server.url, run="life").scripts.fold.name.encode())
    try:
        run_state_machine_as_test(
            SidecarLife,
            settings=settings(
                max_examples=10,
                stateful_step_count=10,
                deadline=None,
                phases=(
                    Phase.explicit,
                    Phase.reuse,
                    Phase.generate,
                ),  # real processes: a failure is reported as found, unshrunk
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            ),
        )
    finally:
        SidecarLife.proxy.close()
        server.kill()
