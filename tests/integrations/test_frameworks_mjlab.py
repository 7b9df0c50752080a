"""The mjlab drop-in inside the real mjlab 1.6.0: its G1 tracking task with a generated motion, a few
envs per collector on the CPU. ``local`` mode is mjlab's own sampling bit for bit; two collector
processes syncing through a real Redis hold, together, the failure EMA of one process fed every
failure; and the frameworks guide's collector (the synced command plus rsl_rl's runner with synced
normalisers) trains in two processes as printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import redisync
from redisync import inspection

from ..conftest import framework_or_skip
from ..test_docs import block_after

pytestmark = [pytest.mark.frameworks, pytest.mark.slow]
framework_or_skip("mjlab.tasks")
from mjlab.envs import ManagerBasedRlEnv  # noqa: E402
from mjlab.tasks.registry import load_env_cfg  # noqa: E402

from redisync.integrations import ProcessFleet  # noqa: E402
from redisync.integrations.mjlab import SyncedMotionCommand, keyframe_motion, synced_motion_command  # noqa: E402

TASK = "Mjlab-Tracking-Flat-Unitree-G1"
ALPHA = 0.001
GUIDE_MARKER = "<!-- the mjlab collector: tests/integrations/test_frameworks_mjlab.py runs this block -->"


def guide_collector() -> str:
    """The mjlab collector of the frameworks guide (docs/guides/frameworks.md)."""
    return block_after(GUIDE_MARKER)[1]


def slots(store: redisync.store.client.Store, key: str) -> set[str]:
    """The shard ids with a slot in a merge key (its metadata hash, as an operator sees it)."""
    return {m.group(1) for f in store.key_info(key) if (m := re.fullmatch(r"slot:(\d+):incarnation", f))}


@pytest.fixture(scope="module")
def motion(tmp_path_factory) -> Path:
    return keyframe_motion(tmp_path_factory.mktemp("motion") / "motion.npz", seconds=6.0)


def tracking_env(
    motion: Path, sync_mode: str | None = None, fleet: ProcessFleet | None = None, seed: int = 7, **sync
) -> ManagerBasedRlEnv:
    cfg = load_env_cfg(TASK)
    cfg.scene.num_envs, cfg.seed = 4, seed
    cfg.commands["motion"].motion_file = str(motion)
    if sync_mode is not None:
        cfg.commands["motion"] = synced_motion_command(cfg.commands["motion"], sync_mode, **sync)
        if fleet is not None:  # the test's own fleet instead of the process's
            cfg.commands["motion"].build = lambda env: SyncedMotionCommand(cfg.commands["motion"], env, fleet)
    torch.manual_seed(seed)
    return ManagerBasedRlEnv(cfg=cfg, device="cpu")


def random_steps(env: ManagerBasedRlEnv, steps: int, seed: int, each=None) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        env.step(torch.randn(env.num_envs, env.action_manager.total_action_dim, generator=g))
        if each is not None:
            each()


def test_local_mode_samples_the_same_starts_as_mjlabs_own_command(motion):
    """In local mode the synced motion command samples the same starts as mjlab's own MotionCommand."""
    runs = {}
    for mode in (None, "local"):
        env = tracking_env(motion, mode)
        command = env.command_manager.get_term("motion")
        assert type(command).__name__ == ("MotionCommand" if mode is None else "SyncedMotionCommand")
        env.reset()
        starts, emas = [], []
        random_steps(
            env,
            80,
            seed=1,
            each=lambda starts=starts, emas=emas, command=command: (
                starts.append(command.time_steps.clone()),
                emas.append(command.bin_failed_count.clone()),
            ),
        )
        runs[mode] = (torch.stack(starts), torch.stack(emas))
        env.close()
    assert float(runs[None][1][-1].sum()) > 0  # envs failed, so the adaptive sampler had something to adapt to
    assert torch.equal(runs[None][0], runs["local"][0])  # the same start frames, step after step
    assert torch.equal(runs[None][1], runs["local"][1])  # and the same failure EMA, bit for bit


def test_observe_mode_samples_mjlabs_own_starts_and_reports_what_it_measures(motion, real_url):
    """Two mjlab collectors in ``observe`` mode: each samples the same starts as mjlab's own
    MotionCommand fed the same steps (the unsynced algorithm, bit for bit) while it reports its EMA and
    its measured drift to the store and reads the fleet's; mjlab's logging carries the drift."""
    own = tracking_env(motion, None, seed=3)
    own.reset()
    starts_own: list[torch.Tensor] = []
    command_own = own.command_manager.get_term("motion")
    random_steps(own, 60, seed=0, each=lambda: starts_own.append(command_own.time_steps.clone()))
    own.close()
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), shard, worker="thread") for shard in (0, 1)]
    envs = []
    try:
        starts: list[list[torch.Tensor]] = [[], []]
        for i, fleet in enumerate(fleets):  # collector 0 takes mjlab's own steps (the same torch RNG's draws)
            envs.append(env := tracking_env(motion, "observe", fleet, seed=3 + i))
            env.reset()
            command = env.command_manager.get_term("motion")
            random_steps(env, 60, seed=i, each=lambda i=i, c=command: starts[i].append(c.time_steps.clone()))
            fleet.flush()
            assert fleet.syncer.wait_synced(timeout=10)
        assert torch.equal(torch.stack(starts[0]), torch.stack(starts_own))
        store = fleets[0].syncer.store
        assert fleets[0].syncer.wait_synced(store.fleet().fleet_version, timeout=10)
        fleets[0].at_reset_boundary()
        fleets[0].flush()
        assert fleets[0].syncer.wait_synced(store.fleet().fleet_version, timeout=10)
        measured = inspection.measured_drift(store)["motion/bin_failed"]
        assert 0 in measured
        assert 0.0 <= measured[0] <= 1.0
        logged = fleets[0].log_metrics(every_s=0.0)
        assert 0.0 <= logged["redisync/motion/bin_failed/drift_tv"] <= 1.0
        assert "redisync/motion/bin_failed/drift_tv_mean" in logged
    finally:
        for fleet in fleets:
            fleet.stop()
        for env in envs:
            env.close()
        redisync.connect(real_url, run=run).delete()


def test_a_collector_that_dies_and_never_restarts_leaves_the_pool_with_stale_after_s(motion, real_url):
    """A collector that dies and never restarts leaves the pooled EMA after stale_after_s."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), shard, worker="thread") for shard in (0, 1)]
    envs = [
        tracking_env(motion, "pooled", fleet, seed=3 + i, stale_after_s=1.0, lifecycle="state")
        for i, fleet in enumerate(fleets)
    ]
    samplers = [env.command_manager.get_term("motion").sampler for env in envs]
    try:
        assert fleets[0].terms[0].schema_entries()["motion/bin_failed"].stale_after_s == 1.0
        for env in envs:
            env.reset()
        for i, env in enumerate(envs):
            random_steps(env, 40, seed=i)
            fleets[i].flush()
            assert fleets[i].syncer.wait_synced(timeout=10)
        assert float(samplers[1].bin_failed_count.sum()) > 0  # the collector about to die had failures to pool
        assert fleets[0].syncer.wait_synced(fleets[1].syncer.store.fleet().fleet_version, timeout=10)
        fleets[0].at_reset_boundary()
        np.testing.assert_allclose(samplers[0]._fleet_ema().numpy(), samplers[1].bin_failed_count.numpy(), rtol=1e-6)
        fleets[1].stop()  # collector 1 dies for good: nothing of it comes back
        envs[1].close()
        time.sleep(1.5)
        random_steps(envs[0], 5, seed=9)
        fleets[0].flush()
        assert fleets[0].syncer.wait_synced(fleets[0].syncer.store.fleet().fleet_version, timeout=10)
        fleets[0].at_reset_boundary()
        assert float(samplers[0]._fleet_ema().abs().sum()) == 0.0  # its frozen EMA left the pool
    finally:
        for fleet in fleets:
            fleet.stop()
        envs[0].close()
        redisync.connect(real_url, run=run).delete()


def test_synced_motion_command_names_its_options_when_one_is_unknown():
    """An unknown option of the synced motion command is refused, naming the options it has."""
    from redisync.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) \['sync_stale_after'\].*'stale_after_s'"):
        synced_motion_command(load_env_cfg(TASK).commands["motion"], stale_after=5)


def _collector(rank: int, motion: str, url: str, run: str, steps: int, barrier, out: dict) -> None:
    fleet = ProcessFleet(redisync.connect(url, run=run), rank)  # the sidecar worker, as in production
    env = tracking_env(Path(motion), "pooled", fleet, seed=rank)
    command = env.command_manager.get_term("motion")
    failures = []
    fold = command._update_command

    def recorded_fold(env_ids=None):
        if env_ids is None:  # the per-step path: this step's failures, just before mjlab folds them
            failures.append(command._current_bin_failed.to(torch.float64).clone())
        fold(env_ids)

    command._update_command = recorded_fold
    env.reset()
    logged: dict = {}  # what mjlab's env put into extras["log"] for its logger, redisync's part

    def log_seen():
        logged.update({k: float(v) for k, v in env.extras.get("log", {}).items() if "redisync" in k})

    random_steps(env, steps, seed=10 + rank, each=log_seen)
    fleet.flush()
    assert fleet.syncer.wait_synced(timeout=20)
    barrier.wait()  # both collectors' last reports are folded
    assert fleet.syncer.wait_synced(at_least=fleet.syncer.store.fleet().fleet_version, timeout=20)
    drawn_from, multinomial = [], torch.multinomial

    def spy(probs, *args, **kwargs):  # the distribution mjlab's own code draws the start bins from
        drawn_from.append(probs.double().clone())
        return multinomial(probs, *args, **kwargs)

    torch.multinomial = spy
    try:
        command._adaptive_sampling(torch.arange(env.num_envs))  # a reset: the fleet state is swapped in, then the draw
    finally:
        torch.multinomial = multinomial
    out[rank] = {
        "failures": torch.stack(failures).numpy(),
        "own": command.sampler.bin_failed_count.double().numpy(),
        "view": command.sampler.sampling_ema().numpy(),
        "drawn_from": drawn_from[0].numpy(),
        "logged": logged,
    }
    fleet.stop()
    env.close()


def test_two_pooled_collectors_hold_the_failure_ema_of_one_process_fed_every_failure(motion, real_url):
    """Two pooled mjlab collectors hold the failure EMA of one process fed both collectors' failures."""
    run, steps = f"t-{uuid.uuid4().hex[:12]}", 150
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out, barrier = manager.dict(), manager.Barrier(2)
        mp.spawn(_collector, args=(str(motion), real_url, run, steps, barrier, out), nprocs=2, join=True)
        out = dict(out)
    store = redisync.connect(real_url, run=run)
    try:
        # the failure EMA is a state key: a rank that stopped first gave its lease up and left it at the
        # other's last fold, so after both stopped it holds the rank(s) that stopped last
        assert slots(store, "motion/bin_failed") in ({"0"}, {"1"}, {"0", "1"})
        for rank in ("0", "1"):
            assert store.redis.hget(store.keys.shards, f"{rank}:alive_until_us") == b"-1"  # both stopped cleanly
        aggregate = store.fleet().keys["motion/bin_failed"].parts()["sum"]
    finally:
        store.delete()
    # one process fed every failure of both, step by step: the EMA of the summed counts
    both = out[0]["failures"] + out[1]["failures"]
    assert both.shape[0] == steps
    assert both.sum() > 0
    single = np.zeros(both.shape[1])
    for current in both:
        single = ALPHA * current + (1 - ALPHA) * single
    np.testing.assert_allclose(aggregate, single, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(aggregate, out[0]["own"] + out[1]["own"], rtol=1e-12)
    ratio = 0.1 / aggregate.size  # mjlab's ε / B
    for rank in (0, 1):  # mjlab's own logging carries the fleet's health, staleness and drift gauge
        logged = out[rank]["logged"]
        assert logged["Metrics/motion/redisync/healthy"] == 1.0, logged
        assert "Metrics/motion/redisync/staleness_versions" in logged
        assert 0.0 <= logged["Metrics/motion/redisync/motion/bin_failed/drift_tv"] <= 1.0
    for rank in (0, 1):  # each collector samples from the fleet's EMA: everybody else's plus its own
        np.testing.assert_allclose(out[rank]["view"], aggregate, rtol=1e-12)
        np.testing.assert_allclose(out[rank]["drawn_from"], (aggregate + ratio) / (aggregate + ratio).sum(), rtol=1e-5)
        assert not np.allclose(out[rank]["own"], aggregate)


def test_the_guides_mjlab_collector_trains_in_two_processes(real_url, tmp_path):
    """The frameworks guide's mjlab collector trains as written in two processes through the store."""
    code = guide_collector()
    run = f"t-{uuid.uuid4().hex[:12]}"
    procs = []
    for shard in (0, 1):
        env = {**os.environ, "REDISYNC_URL": real_url, "REDISYNC_RUN": run, "REDISYNC_SHARD": str(shard)}
        # a folder each, as two hosts would have: rsl_rl writes logs/git/<repo>.diff with a check-then-create
        # that two processes starting together in one folder race on (FileExistsError, seen in a rehearsal)
        (tmp_path / f"shard{shard}").mkdir()
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=tmp_path / f"shard{shard}",
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    store = redisync.connect(real_url, run=run)
    try:
        for p, output in zip(procs, outputs, strict=False):
            assert p.returncode == 0, output[-3000:]
        keys = store.fleet().keys
        # the failure EMA is a state key: a rank that stopped first gave its lease up and left it at the
        # other's last fold, so after both stopped it holds the rank(s) that stopped last
        assert slots(store, "motion/bin_failed") in ({"0"}, {"1"}, {"0", "1"})
        for rank in ("0", "1"):
            assert store.redis.hget(store.keys.shards, f"{rank}:alive_until_us") == b"-1"  # both stopped cleanly
        # rsl_rl updates each normaliser once per iteration with its rollout: 2 iterations × 8 steps × 4 envs
        for name in ("rsl_rl/actor.obs_normalizer", "rsl_rl/critic.obs_normalizer"):
            assert slots(store, name) == {"0", "1"}
            assert float(np.ravel(keys[name].parts()["count"])[0]) == 2 * (2 * 8 * 4)
    finally:
        store.delete()
