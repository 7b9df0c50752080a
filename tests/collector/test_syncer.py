"""The Syncer: the fleet converges, the hot path never waits on the network, a lost store is re-seeded."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import redisync
from redisync.collector.workers import new_syncer
from redisync.terms.torch import AdaptiveMotionSampler, PenaltyCurriculum, SyncedEmpiricalNormalization

from ..conftest import backend_url
from ..servers import RedisProcess
from ..support import socket_calls_of_this_thread

F64 = torch.float64
FRAMES, ENVS = 500, 32


class Collector:
    """One simulated collector: a sampler and a normaliser fed by its own stream, and a penalty
    curriculum whose scale shard 0 decides (a broadcast key)."""

    def __init__(self, shard: int):
        self.sampler = AdaptiveMotionSampler(FRAMES, 0.02, mode="pooled", shard_id=shard, rebuild_tol=0.0, dtype=F64)
        self.norm = SyncedEmpiricalNormalization(3, mode="pooled")
        self.penalty = PenaltyCurriculum(0.5, degree=0.01, mode="broadcast", shard_id=shard, owner=0)
        self.g = torch.Generator().manual_seed(100 + shard)
        self.samples = 0

    def step(self) -> None:
        ts = torch.randint(0, FRAMES, (ENVS,), generator=self.g)
        failed = torch.rand(ENVS, generator=self.g) < 0.05
        self.sampler.record_failures(ts, failed)
        self.sampler.step()
        self.norm.update(torch.randn(ENVS, 3, generator=self.g, dtype=F64))
        self.penalty.update(1000.0)  # long episodes: the owner raises the scale
        self.samples += ENVS

    @property
    def terms(self) -> list:
        return [self.sampler, self.norm, self.penalty]


def run(collectors, syncers, steps, reset_every=10):
    for step in range(steps):
        for c, s in zip(collectors, syncers, strict=False):
            c.step()
            s.on_step()
            if step % reset_every == 0:
                s.at_reset_boundary()


def converge(store, collectors, syncers, timeout=20.0):
    """Flush everybody, wait until every syncer holds the final state, apply it."""
    for s in syncers:
        s.flush()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in syncers:
            s.flush()
            assert s.wait_synced(timeout=timeout)
        final = store.fleet().fleet_version
        if all(s.wait_synced(final, timeout=2) for s in syncers):
            break
    for s in syncers:
        s.at_reset_boundary()
    return final


def assert_pooled(collectors):
    total = sum(c.sampler.bin_failed_count for c in collectors)
    for c in collectors:
        np.testing.assert_allclose(c.sampler.sampling_ema(), total, rtol=1e-9, atol=1e-15)
        assert c.norm.pooled_moments()[2] == sum(x.samples for x in collectors)
        assert c.penalty.scale == collectors[0].penalty.scale  # the owner's decision, everywhere


@pytest.mark.parametrize(("backend", "worker"), [("embedded", "thread"), ("real", "thread"), ("real", "process")])
def test_fleet_converges_through_syncers(backend, worker, make_store):
    """Four collectors through their Syncers, either worker, either backend: each samples from every
    shard's failures, pools every shard's samples and holds the owner's penalty scale, and each
    metric the Syncer reports is documented in metrics()."""
    store_url = backend_url(backend)
    run_name = make_store().run
    collectors = [Collector(i) for i in range(4)]
    syncers = [
        new_syncer(
            redisync.connect(store_url, run=run_name),
            i,
            c.terms,
            publish_every_steps=15,
            poll_every_s=0.05,
            worker=worker,
        ).start()
        for i, c in enumerate(collectors)
    ]
    try:
        run(collectors, syncers, 200)
        converge(syncers[0].store, collectors, syncers)
        assert_pooled(collectors)
        m = syncers[0].metrics()
        assert m["redisync/publishes"] > 0
        assert m["redisync/fleet_version"] >= 4
        assert m["redisync/staleness_versions"] == 0
        assert m["redisync/subscribed"] == 1.0
        assert "redisync/motion/bin_failed/drift_tv" in m
        assert "redisync/publish_latency_ms" in m
        # every metric is documented in metrics()'s docstring (a term's by its pattern)
        doc = " ".join(type(syncers[0]).metrics.__doc__.split())
        for name in m:
            short = name.removeprefix("redisync/")
            key = next((t.key for t in collectors[0].terms if short.startswith(f"{getattr(t, 'key', '')}/")), None)
            if key is None:
                assert f"`{name}`" in doc or f"`{short}`" in doc or f"`{name.rsplit('_', 1)[0]}`" in doc, name
            else:
                assert "`redisync/<key>/<name>`" in doc, name
    finally:
        for s in syncers:
            s.stop(flush=False)


@pytest.mark.integration
@pytest.mark.parametrize("worker", ["thread", "process"])
def test_hot_path_survives_a_killed_redis_and_the_fleet_catches_up(tmp_path, worker):
    """Redis killed under two training collectors: they train on (their hot path makes no socket
    call), the worker counts the failures off the hot path, and after an empty restart the
    cumulative reports re-seed the fleet exactly."""
    server = RedisProcess(tmp_path).start()
    collectors = [Collector(i) for i in range(2)]
    syncers = [
        new_syncer(
            redisync.connect(server.url, run="hotpath", socket_timeout=1.0),
            i,
            c.terms,
            publish_every_steps=10,
            poll_every_s=0.05,
            retry_every_s=0.1,
            worker=worker,
        ).start()
        for i, c in enumerate(collectors)
    ]
    try:
        run(collectors, syncers, 100)
        converge(syncers[0].store, collectors, syncers)
        assert_pooled(collectors)

        server.kill()
        before = collectors[0].sampler.bin_failed_count.clone()
        with socket_calls_of_this_thread() as calls:
            run(collectors, syncers, 300)
        # the collectors never waited on the dead server: their hot path made no socket call at all
        assert calls == []
        assert not torch.equal(before, collectors[0].sampler.bin_failed_count)  # training went on locally
        deadline = time.monotonic() + 10
        while sum(s.stats["publish_failures"] for s in syncers) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(s.stats["publish_failures"] for s in syncers) > 0  # the worker noticed, off the hot path
        assert all(s.stats["worker_errors"] == 0 for s in syncers)

        t0 = time.monotonic()
        server.start()  # empty: no persistence; the run is gone
        run(collectors, syncers, 50)
        converge(syncers[0].store, collectors, syncers)
        print(f"\nrecovered {time.monotonic() - t0:.2f}s after the restart")
        assert all(s.stats["reseeds"] >= 1 for s in syncers)
        assert_pooled(collectors)  # nothing lost: the cumulative reports re-seeded the fleet exactly
        fleet = syncers[0].store.fleet().keys
        assert float(fleet["obs/norm"].parts()["count"]) == sum(c.samples for c in collectors)
        assert (
            float(fleet["curriculum/penalty_scale"].parts()["value"]) == collectors[0].penalty.scale
        )  # re-seeded by its owner
    finally:
        for s in syncers:
            s.stop(flush=False)
        server.kill()


def test_a_paused_redis_never_stalls_the_shared_hot_path_and_the_fleet_catches_up(tmp_path):
    """SIGSTOP: the server holds every connection open and answers nothing. The process worker's
    shared terms (the sampler both ways, the normaliser's report) keep training; once it resumes,
    the sidecars publish what the shared buffers hold and the fleet is exact again."""
    import signal

    server = RedisProcess(tmp_path).start()
    collectors = [Collector(i) for i in range(2)]
    syncers = [
        new_syncer(
            redisync.connect(server.url, run="paused", socket_timeout=1.0),
            i,
            c.terms,
            publish_every_steps=1,
            poll_every_s=0.05,
            retry_every_s=0.1,
            worker="process",
        ).start()
        for i, c in enumerate(collectors)
    ]
    try:
        assert all(
            s.worker._shared is not None and c.sampler not in s.reporting + s.worker._handed
            for s, c in zip(syncers, collectors, strict=False)
        )
        run(collectors, syncers, 50, reset_every=1)
        converge(syncers[0].store, collectors, syncers)
        assert_pooled(collectors)
        server.proc.send_signal(signal.SIGSTOP)
        with socket_calls_of_this_thread() as calls:
            run(collectors, syncers, 300, reset_every=1)
        assert calls == []  # the hot path made no socket call while the server answered nothing
        deadline = time.monotonic() + 10
        while sum(s.stats["publish_failures"] for s in syncers) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum(s.stats["publish_failures"] for s in syncers) > 0  # the sidecars timed out, off the hot path
        server.proc.send_signal(signal.SIGCONT)
        converge(syncers[0].store, collectors, syncers)
        assert_pooled(collectors)  # everything trained while paused reached the fleet
        assert float(syncers[0].store.fleet().keys["obs/norm"].parts()["count"]) == sum(c.samples for c in collectors)
    finally:
        server.proc.send_signal(signal.SIGCONT)
        for s in syncers:
            s.stop(flush=False)
        server.kill()


@pytest.mark.integration
def test_a_lost_and_a_regained_connection_are_each_said_once(tmp_path, caplog):
    """A store that stops answering mid-training was logged by nothing (only healthy turned 0): the
    worker says it once as a warning, however many retries fail, and once when the store answers."""
    server = RedisProcess(tmp_path).start()
    collector = Collector(0)
    syncer = new_syncer(
        redisync.connect(server.url, run="lost", socket_timeout=1.0),
        0,
        collector.terms,
        publish_every_steps=5,
        poll_every_s=0.05,
        retry_every_s=0.05,
        worker="thread",
    ).start()
    try:
        with caplog.at_level("INFO", logger="redisync"):
            run([collector], [syncer], 20)
            server.kill()
            deadline = time.monotonic() + 20
            while syncer.stats["publish_failures"] + syncer.stats["pull_failures"] < 10 and time.monotonic() < deadline:
                run([collector], [syncer], 10)
                time.sleep(0.05)
            assert syncer.stats["publish_failures"] + syncer.stats["pull_failures"] >= 10  # many retries failed
            server.start()
            assert syncer.wait_synced(timeout=30)
            lost = [r for r in caplog.records if "the store is unreachable" in r.getMessage()]
            back = [r for r in caplog.records if "the store answers again" in r.getMessage()]
            assert len(lost) == 1
            assert lost[0].levelname == "WARNING"
            assert len(back) == 1
    finally:
        syncer.stop(flush=False)
        server.kill()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_runs_limits_survive_a_store_that_lost_the_run(real_url, worker):
    """A learner registered the run with limits of its own; the store restarts without persistence and
    a collector registers the run again: with the run's limits, not the defaults."""
    from redisync.store.schema import Limits

    learner = redisync.connect(real_url, run=f"limits-{worker}")
    collector = Collector(0)
    learner.register(collector_schema(collector), Limits(stream_maxlen=7, max_report_bytes=1 << 20))
    syncer = new_syncer(
        redisync.connect(real_url, run=learner.run), 0, collector.terms, publish_every_steps=5, worker=worker
    ).start()
    try:
        run([collector], [syncer], 20)
        assert syncer.wait_synced(timeout=20)
        learner.delete()  # the store lost the run
        deadline = time.monotonic() + 30
        while not learner.registered() and time.monotonic() < deadline:
            run([collector], [syncer], 5)
            time.sleep(0.05)
        assert learner.registered()
        assert learner.limits() == Limits(stream_maxlen=7, max_report_bytes=1 << 20)
    finally:
        syncer.stop(flush=False)
        learner.delete()


def collector_schema(collector) -> dict:
    """The schema a collector's terms declare (what its Syncer registers)."""
    entries: dict = {}
    for term in collector.terms:
        entries.update(term.schema_entries())
    return entries
