"""The holosoma WBT drop-in inside the real holosoma 0.0.3: the adaptive sampler of its
``MotionCommand`` as the G1 WBT preset builds it (the preset's own motion, holosoma's defaults),
driven in the order ``MotionCommand`` calls it; and its FastSAC agent's normaliser."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import redisync
from redisync.errors import ConfigurationError

from ..conftest import framework_or_skip

pytestmark = pytest.mark.frameworks
framework_or_skip("holosoma.managers.command.terms.wbt")
import holosoma  # noqa: E402
from holosoma.agents.fast_sac.fast_sac_utils import EmpiricalNormalization as FastSacNormalization  # noqa: E402
from holosoma.config_values.wbt.g1.command import motion_config  # noqa: E402
from holosoma.managers.command.terms.wbt import AdaptiveTimestepsSampler  # noqa: E402

from redisync.integrations import ProcessFleet  # noqa: E402
from redisync.integrations.holosoma_wbt import (  # noqa: E402
    SyncedAdaptiveTimestepsSampler,
    SyncedFastSacNormalization,
    sync_fastsac_normalizers,
    sync_motion_command,
)

FPS = 50  # the WBT preset's control rate
T = int(np.load(Path(holosoma.__file__).parents[1] / motion_config.motion_file)["joint_pos"].shape[0])


def failures(rank: int, step: int, n: int = 24) -> torch.Tensor:
    """The time steps of the envs that failed this step: rank 0 late in the motion, rank 1 early."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    ts = torch.randint(0, T, (n,), generator=g)
    keep = torch.rand(n, generator=g) < torch.where((ts > T * 0.6) if rank == 0 else (ts < T * 0.3), 0.5, 0.02)
    return ts[keep]


def drive(sampler, rank: int, steps: int, draws: list | None = None) -> None:
    """What ``MotionCommand`` does with its sampler: at reset, failures added (twice per step when
    clip-ended envs reset after the terminated ones) and starts drawn; once per step, the EMA fold."""
    for step in range(steps):
        failed = failures(rank, step)
        for wave in (failed[: len(failed) // 2], failed[len(failed) // 2 :]):
            if len(wave):  # holosoma calls it only for envs that failed
                sampler.update_current_bin_failed_count(wave)
        torch.manual_seed(step)
        idx = sampler.sample_global_time_steps(16)
        if draws is not None:
            draws.append(idx)
        sampler.update_bin_failed_count()


def test_the_preset_builds_a_sampler_of_the_motion_the_test_uses():
    """The holosoma WBT preset the tests use builds the adaptive timesteps sampler of a motion longer than one
    second."""
    assert motion_config.use_adaptive_timesteps_sampler
    assert T > FPS


def test_local_mode_draws_what_holosomas_own_sampler_draws():
    """In local mode the synced sampler draws exactly what holosoma's own AdaptiveTimestepsSampler draws from
    the same generator."""
    own, synced = AdaptiveTimestepsSampler(T, "cpu", FPS), None
    fleet = ProcessFleet(redisync.connect(None), 0)
    synced = SyncedAdaptiveTimestepsSampler.replacing(
        AdaptiveTimestepsSampler(T, "cpu", FPS), mode="local", fleet=fleet
    )
    theirs, ours = [], []
    drive(own, 0, 120, theirs)
    drive(synced, 0, 120, ours)
    assert float(own.bin_failed_count.sum()) > 0
    assert torch.equal(torch.stack(theirs), torch.stack(ours))  # the same starts, draw after draw
    assert torch.equal(own.bin_failed_count, synced.bin_failed_count)  # and the same EMA, bit for bit
    own.get_stats(), synced.get_stats()
    assert {k: float(v) for k, v in own.metrics.items()} == {k: float(v) for k, v in synced.metrics.items()}
    assert fleet.terms == []  # local: nothing synced


def _rank(rank: int, url: str, run: str, steps: int, barrier, out: dict) -> None:
    fleet = ProcessFleet(redisync.connect(url, run=run), rank, worker="thread")
    command = type("MotionCommand", (), {})()  # holds the sampler as holosoma's MotionCommand does
    command.adaptive_timesteps_sampler = AdaptiveTimestepsSampler(T, "cpu", FPS)
    sync_motion_command(command, fleet=fleet)
    sampler = command.adaptive_timesteps_sampler
    drive(sampler, rank, steps)
    fleet.flush()
    assert fleet.syncer.wait_synced(timeout=20)
    barrier.wait()  # both published their last EMA
    final = fleet.syncer.store.fleet().fleet_version
    assert fleet.syncer.wait_synced(final, timeout=20)
    sampler.sample(1)  # a draw: the newest fleet state swapped in
    sampler._drawing = True
    out[rank] = (sampler.sampling_probabilities.clone(), sampler.state.bin_failed_count.clone())
    sampler._drawing = False
    fleet.stop()


@pytest.mark.slow  # two spawned processes
def test_two_pooled_processes_draw_from_the_ema_of_one_sampler_fed_every_failure(real_url):
    """Two pooled processes draw from the failure EMA of one sampler fed both processes' failures."""
    run, steps = f"t-{uuid.uuid4().hex[:12]}", 150
    ctx = mp.get_context("spawn")
    out, barrier = ctx.Manager().dict(), ctx.Barrier(2)
    procs = [ctx.Process(target=_rank, args=(r, real_url, run, steps, barrier, out)) for r in (0, 1)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
            assert p.exitcode == 0
    finally:
        redisync.connect(real_url, run=run).delete()
    reference = AdaptiveTimestepsSampler(T, "cpu", FPS)  # holosoma's own, fed both ranks' failures
    for step in range(steps):
        reference.update_current_bin_failed_count(torch.cat([failures(0, step), failures(1, step)]))  # never empty here
        reference.update_bin_failed_count()
    for rank in (0, 1):
        probs, _ = out[rank]
        torch.testing.assert_close(probs, reference.sampling_probabilities, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(out[0][1] + out[1][1], reference.bin_failed_count, rtol=1e-5, atol=1e-7)
    alone = AdaptiveTimestepsSampler(T, "cpu", FPS)
    alone.bin_failed_count = out[0][1]
    assert float((alone.sampling_probabilities - out[0][0]).abs().sum()) > 0.1  # pooling moved rank 0's starts


def test_a_rank_that_dies_and_never_returns_leaves_the_pool(real_url):
    """A rank gone for good (its lease given up) leaves the pooled EMA at the next fold: the survivor samples
    from its own EMA alone."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), r, worker="thread") for r in (0, 1)]
    samplers = []
    try:
        for fleet in fleets:
            command = type("MotionCommand", (), {})()
            command.adaptive_timesteps_sampler = AdaptiveTimestepsSampler(T, "cpu", FPS)
            sync_motion_command(command, fleet=fleet, stale_after_s=1.0)
            samplers.append(command.adaptive_timesteps_sampler)
        for rank, sampler in enumerate(samplers):
            drive(sampler, rank, 60)
            fleets[rank].flush()
            assert fleets[rank].syncer.wait_synced(timeout=10)
        assert fleets[0].syncer.wait_synced(fleets[1].syncer.store.fleet().fleet_version, timeout=10)
        fleets[0].at_reset_boundary()
        assert float(samplers[0].state.sampling_ema().sum() - samplers[0].state.bin_failed_count.sum()) > 0
        fleets[1].stop()  # rank 1 is gone for good
        import time

        time.sleep(1.5)
        drive(samplers[0], 0, 5)
        fleets[0].flush()
        assert fleets[0].syncer.wait_synced(fleets[0].syncer.store.fleet().fleet_version, timeout=10)
        fleets[0].at_reset_boundary()
        torch.testing.assert_close(samplers[0].state.sampling_ema(), samplers[0].state.bin_failed_count.double())
    finally:
        for fleet in fleets:
            fleet.stop()
        redisync.connect(real_url, run=run).delete()


def test_a_command_without_the_adaptive_sampler_is_refused():
    """A motion command without holosoma's adaptive sampler is refused, naming the setting to turn on."""
    with pytest.raises(ConfigurationError, match="use_adaptive_timesteps_sampler=True"):
        sync_motion_command(
            type("Env", (), {"command_manager": type("M", (), {"_state_terms": {}})()})(),
            fleet=ProcessFleet(redisync.connect(None), 0),
        )


class FastSacAgent:
    """The two normalisers holosoma's FastSAC agent holds, built as it builds them."""

    def __init__(self):
        self.obs_normalizer = FastSacNormalization(shape=6, device="cpu")
        self.critic_obs_normalizer = FastSacNormalization(shape=9, device="cpu")


def test_fastsac_normalisers_are_replaced_with_their_state_and_called_as_holosoma_calls_them(real_url):
    """FastSAC's normalisers are replaced keeping their statistics, and called as holosoma calls them give
    what holosoma's give."""
    agent, theirs = FastSacAgent(), FastSacAgent()
    g = torch.Generator().manual_seed(0)
    warm = torch.randn(32, 6, generator=g) * 3 + 1
    agent.obs_normalizer(warm), theirs.obs_normalizer(warm)
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleet = ProcessFleet(redisync.connect(real_url, run=run), 0, worker="thread")
    try:
        sync_fastsac_normalizers(agent, mode="local", fleet=fleet)
        assert isinstance(agent.obs_normalizer, SyncedFastSacNormalization)
        torch.testing.assert_close(agent.obs_normalizer._mean, theirs.obs_normalizer._mean)  # the state carried over
        for _ in range(5):
            x = torch.randn(32, 6, generator=g) * 3 + 1
            for kw in ({}, {"update": False}, {"center": False}):
                assert torch.equal(
                    agent.obs_normalizer(x, **kw), theirs.obs_normalizer(x, **kw)
                )  # holosoma's update, bit for bit
        theirs.obs_normalizer.load_state_dict(agent.obs_normalizer.state_dict())  # checkpoints load both ways
    finally:
        fleet.stop()
        redisync.connect(real_url, run=run).delete()


def test_pooled_fastsac_normalisers_hold_the_statistics_of_every_sample(real_url):
    """Pooled FastSAC normalisers in two processes hold the statistics of every sample either saw."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), r, worker="thread") for r in (0, 1)]
    agents, reference, seen = [FastSacAgent(), FastSacAgent()], FastSacNormalization(6, "cpu"), []
    try:
        for fleet, agent in zip(fleets, agents, strict=False):
            sync_fastsac_normalizers(agent, fleet=fleet)
        for step in range(4):
            batches = [
                torch.randn(64, 6, generator=torch.Generator().manual_seed(10 * r + step)) * (r + 1) + r for r in (0, 1)
            ]
            for agent, x in zip(agents, batches, strict=False):
                agent.obs_normalizer(x)
            reference(torch.cat(batches))  # holosoma's own, fed every batch (its count; its mean to float32)
            seen.extend(batches)
        for fleet in fleets:
            fleet.flush()
            assert fleet.syncer.wait_synced(timeout=10)
        final = fleets[0].syncer.store.fleet().fleet_version
        for fleet, agent in zip(fleets, agents, strict=False):
            assert fleet.syncer.wait_synced(final, timeout=10)
            fleet.at_reset_boundary()
            norm = agent.obs_normalizer
            assert int(norm.count) == int(reference.count) == 2 * 4 * 64
            torch.testing.assert_close(norm._mean, reference._mean, rtol=1e-5, atol=1e-5)
            exact = torch.cat(seen).double().var(dim=0, unbiased=False)
            torch.testing.assert_close(norm._var.squeeze(0).double(), exact, rtol=1e-5, atol=1e-6)
    finally:
        for fleet in fleets:
            fleet.stop()
        redisync.connect(real_url, run=run).delete()


def test_an_agent_without_normalisation_is_refused():
    """An agent without observation normalisation is refused, naming the setting."""
    agent = type("Agent", (), {"obs_normalizer": torch.nn.Identity()})()
    with pytest.raises(ConfigurationError, match="obs_normalization=True"):
        sync_fastsac_normalizers(agent, fleet=ProcessFleet(redisync.connect(None), 0))


def test_rsl_rls_sync_normalizers_points_a_holosoma_agent_to_its_own_drop_in():
    """rsl_rl's sync_normalizers given a holosoma FastSAC agent names the drop-in to use instead."""
    from redisync.integrations.rsl_rl import sync_normalizers

    with pytest.raises(
        ConfigurationError,
        match=r"obs_normalizer, critic_obs_normalizer is holosoma FastSAC's.*sync_fastsac_normalizers",
    ):
        sync_normalizers(FastSacAgent(), fleet=ProcessFleet(redisync.connect(None), 0))


def test_the_envs_log_dict_carries_the_fleets_metrics(real_url):
    """holosoma's agents log the env's ``log_dict`` as ``Env/...``: synced through the env, the motion
    command's sampler puts the fleet's health, staleness and drift gauge there each step."""
    fleet = ProcessFleet(redisync.connect(real_url, run=f"t-{uuid.uuid4().hex[:12]}"), 0, worker="thread")
    command = type("MotionCommand", (), {})()
    command.adaptive_timesteps_sampler = AdaptiveTimestepsSampler(T, "cpu", FPS)
    manager = type("CommandManager", (), {})()  # the env's command manager keeps its terms in _state_terms
    manager._state_terms = {"motion": command}
    env = type("WbtEnv", (), {})()
    env.command_manager, env.log_dict = manager, {}
    try:
        sync_motion_command(env, fleet=fleet)
        drive(command.adaptive_timesteps_sampler, 0, 5)
        assert torch.is_tensor(env.log_dict["redisync/healthy"])
        assert float(env.log_dict["redisync/healthy"]) == 1.0
        assert "redisync/staleness_versions" in env.log_dict
        assert 0.0 <= float(env.log_dict["redisync/holosoma/motion.bin_failed/drift_tv"]) <= 1.0  # the key's drift
    finally:
        fleet.stop()
        fleet.syncer.store.delete()
