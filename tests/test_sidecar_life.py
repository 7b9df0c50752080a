"""A model-based test of the process worker's life: hypothesis drives what a collector with a
sidecar lives through, with the sampler and the normaliser on the shared-memory path.

Rules: train a shard some steps, SIGKILL its sidecar (the collector starts another on the same
shared memory), restart the collector fresh or resumed from a checkpoint (a graceful stop, a new
process life), restart the store empty (the sidecars re-seed it), and settle (flush, wait, take the
fleet in). The model: per shard the samples its live normaliser saw, the samples retired by earlier
lives since the store last restarted, and the samplers' own EMAs. When settled, the store holds
every live shard's own buffers exactly, every sampler draws from the sum of the live shards' EMAs
(own substitution through the staged fleet state), and every normaliser pools exactly the live and
retired samples — nothing counted twice, nothing lost.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

import redisync
from redisync.syncer import Syncer
from redisync.torch import AdaptiveMotionSampler, SyncedEmpiricalNormalization

from .servers import RedisProcess
from .support import wait_for

pytestmark = pytest.mark.integration  # a redis-server of its own, restarted by a rule

SHARDS, FRAMES, ENVS, DIMS = (0, 1), 200, 16, 3


class Collector:
    """One life of a collector process: its terms, its generator and its syncer."""

    def __init__(self, url: str, shard: int, seed: int, checkpoint: dict | None = None):
        self.sampler = AdaptiveMotionSampler(FRAMES, 0.02, mode="pooled", shard_id=shard, rebuild_tol=0.0,
                                             dtype=torch.float64)
        self.norm = SyncedEmpiricalNormalization(DIMS, mode="pooled")
        if checkpoint is not None:  # the sampler resumes its slot; the normaliser's slot is retired history
            self.sampler.load_state_dict(checkpoint["sampler"])
            self.norm.load_state_dict(checkpoint["norm"])
        self.g = torch.Generator().manual_seed(seed)
        self.samples = 0
        self.syncer = Syncer(redisync.connect(url, run="life", socket_timeout=1.0), shard, [self.sampler, self.norm],
                             worker="process", publish_every_steps=1, poll_every_s=0.05, retry_every_s=0.1).start()

    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.sampler.record_failures(torch.randint(0, FRAMES, (ENVS,), generator=self.g),
                                         torch.rand(ENVS, generator=self.g) < 0.3)
            self.sampler.step()
            self.norm.update(torch.randn(ENVS, DIMS, generator=self.g, dtype=torch.float64))
            self.samples += ENVS
            self.syncer.on_step()
            self.syncer.at_reset_boundary()

    def checkpoint(self) -> dict:
        return {"sampler": {k: v.clone() for k, v in self.sampler.state_dict().items()},
                "norm": {k: v.clone() for k, v in self.norm.state_dict().items()}}


class SidecarLife(RuleBasedStateMachine):
    server: RedisProcess

    @initialize()
    def start(self) -> None:
        self.store = redisync.connect(self.server.url, run="life")
        self.store.delete()
        self.collectors = {shard: Collector(self.server.url, shard, seed=shard) for shard in SHARDS}
        self.retired = 0  # samples of earlier lives, kept as retired history since the store last restarted
        self.lives = len(SHARDS)

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(1, 40))
    def train(self, shard: int, steps: int) -> None:
        self.collectors[shard].train(steps)

    @rule(shard=st.sampled_from(SHARDS), steps=st.integers(0, 20))
    def kill_sidecar(self, shard: int, steps: int) -> None:
        c = self.collectors[shard]
        first = c.syncer.sidecar_pid
        os.kill(first, signal.SIGKILL)
        c.train(steps)  # the collector trains on, its view stale for a moment
        assert wait_for(lambda: c.syncer.sidecar_pid != first, timeout=10)

    @rule(shard=st.sampled_from(SHARDS), resume=st.booleans())
    def restart_collector(self, shard: int, resume: bool) -> None:
        old = self.collectors[shard]
        checkpoint = old.checkpoint() if resume else None
        old.syncer.stop(flush=True)
        self.retired += old.samples  # its normaliser slot stays as history, resumed or not
        self.lives += 1
        self.collectors[shard] = Collector(self.server.url, shard, seed=100 * self.lives, checkpoint=checkpoint)

    @rule()
    def restart_store(self) -> None:
        self.server.kill()
        self.server.start()  # empty: the live sidecars re-seed their own slots; retired history is gone
        self.retired = 0

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
        assert float(fleet["obs/norm"].parts()["count"]) == sum(x.samples for x in self.collectors.values()) + self.retired
        assert self.store.dead_letters() == []

    def teardown(self) -> None:
        try:
            if hasattr(self, "collectors"):
                self.settle()  # every life ends settled and checked
        finally:
            for c in getattr(self, "collectors", {}).values():
                c.syncer.stop(flush=False)


def test_a_collector_with_a_sidecar_lives_through_kills_restarts_and_a_lost_store(tmp_path):
    server = RedisProcess(tmp_path).start()
    SidecarLife.server = server
    try:
        run_state_machine_as_test(SidecarLife, settings=settings(
            max_examples=6, stateful_step_count=8, deadline=None,
            phases=(Phase.explicit, Phase.reuse, Phase.generate),  # real processes: a failure is reported as found, unshrunk
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]))
    finally:
        server.kill()
