"""The MotrixLab drop-in inside the real async FastSAC of ``motrix-rl-builtin`` 0.4.0: a numpy
tracking task of ours (:mod:`tests.motrix_task`) whose command keeps its adaptive sampler the way
MotrixLab's ``WbtMotionCommand`` does, trained with 2 and 4 spawned collectors, each collector
failing in its own segment of the motion."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import redisync
from redisync.learner import FleetMonitor

from .conftest import framework_or_skip

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.integration]
framework_or_skip("motrix_rl_builtin.fastsac.async_impl.train")
from .motrix_task import KILL_AT, TRACE, TrackingCfg  # noqa: E402
from .motrix_task.train import train  # noqa: E402

KEY = "motion/bin_failed"
CFG = TrackingCfg()
BINS = CFG.frames // 50 + 1


def command_cdf(ema: np.ndarray) -> np.ndarray:
    """The test command's own formula (``ema + ε/B``), the oracle of what a collector drew from."""
    p = ema.astype(np.float32) + np.float32(CFG.uniform_ratio / BINS)
    c = np.cumsum(p / p.sum())
    return c / c[-1]


def hard_bins(collector: int) -> slice:
    start, end = CFG.hard_segments[collector % len(CFG.hard_segments)]
    return slice(start * BINS // CFG.frames, (end - 1) * BINS // CFG.frames + 1)


@pytest.fixture
def fleet_run(real_url, tmp_path, monkeypatch):
    """Runs of the task against one redisync run on the real Redis; the run deleted afterwards."""
    run = f"motrix-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("REDISYNC_URL", real_url)
    monkeypatch.setenv("REDISYNC_RUN", run)
    made: list[int] = []

    def go(env: str, collectors: int, iterations: int, *, kill: str | None = None) -> dict[int, dict]:
        trace = tmp_path / f"trace{len(made)}"
        trace.mkdir()
        made.append(1)
        monkeypatch.setenv(TRACE, str(trace))
        if kill:
            monkeypatch.setenv(KILL_AT, kill)
        else:
            monkeypatch.delenv(KILL_AT, raising=False)
        started = time.perf_counter()
        try:
            train(env, tmp_path / "runs", collectors=collectors, iterations=iterations)
        except RuntimeError as e:  # the trainer stops when a collector dies
            assert kill and "exit code -9" in str(e), e
        else:
            assert not kill, "the trainer finished although a collector was killed"
        print(f"{env}: {collectors} collectors, {iterations} iterations in {time.perf_counter() - started:.1f} s")
        return {i: dict(np.load(trace / f"collector{i}.npz")) for i in range(collectors)}

    yield go, redisync.connect(real_url, run=run)
    redisync.connect(real_url, run=run).delete()


def pooled_sum(store) -> tuple[np.ndarray, float]:
    monitor = FleetMonitor(store)
    monitor.refresh()
    parts = monitor.state.keys[KEY].parts()
    return parts["sum"], float(parts["count"])


@pytest.mark.parametrize("collectors", [2, 4])
def test_async_collectors_sample_from_the_pooled_failure_ema(fleet_run, collectors):
    go, store = fleet_run
    traces = go("redisync-tracking", collectors, 200)
    for i, t in traces.items():
        # the fleet state arrives (how many resets come before the first pull depends on the machine's
        # load) and, once there, stays: the version a collector samples from never goes back
        synced = t["version"] > 0
        assert synced.any(), f"collector {i} never held fleet state in {len(synced)} resets"
        first = int(synced.argmax())
        assert synced[first:].all() and (np.diff(t["version"][first:]) >= 0).all()
        # every draw came from the command's own formula applied to the fleet's EMA (others as pulled + own now)
        for cdf, own, fleet in zip(t["cdf"], t["own"], t["fleet"]):
            np.testing.assert_allclose(cdf, command_cdf((fleet + own).astype(np.float32)), rtol=1e-5, atol=1e-6)
        # ... which holds the other collectors' failures: where *they* fail carries weight here too
        assert np.abs(t["fleet"][-1]).sum() > 0  # the last reset is after the first pull (asserted above)
    for i, t in traces.items():
        pooled = np.diff(t["cdf"][-1], prepend=0)
        alone = np.diff(command_cdf(t["own"][-1]), prepend=0)  # what the collector would draw from unsynced
        for j in traces:
            if CFG.hard_segments[i % 2] != CFG.hard_segments[j % 2]:
                where = hard_bins(j)
                assert pooled[where].sum() > alone[where].sum(), f"collector {i} ignores where collector {j} fails"
    # at exit each collector published its last EMA: the store holds exactly the fleet's sum
    total, count = pooled_sum(store)
    assert count == collectors
    np.testing.assert_allclose(total, sum(t["final"].astype(np.float64) for t in traces.values()), rtol=1e-6, atol=1e-9)


def test_the_run_trains_as_without_redisync(fleet_run):
    go, _ = fleet_run
    plain = go("redisync-tracking-plain", 2, 150)
    synced = go("redisync-tracking", 2, 150)
    for traces in (plain, synced):
        assert all(len(t["cdf"]) > 0 for t in traces.values())  # every collector stepped and reset
    # unsynced, a collector never sees where the other fails; synced, it does
    assert all(np.abs(t["fleet"]).sum() == 0 for t in plain.values())
    assert all(np.abs(t["fleet"][-1]).sum() > 0 for t in synced.values())


def test_a_killed_collector_restarted_is_not_counted_twice(fleet_run):
    go, store = fleet_run
    go("redisync-tracking", 2, 2000, kill="1:30")  # collector 1 SIGKILLed at its 30th reset; the trainer stops
    again = go("redisync-tracking", 2, 150)  # the run restarted: both shards start new lives
    total, count = pooled_sum(store)
    assert count == 2
    np.testing.assert_allclose(total, again[0]["final"] + again[1]["final"].astype(np.float64), rtol=1e-6, atol=1e-9)


def test_a_killed_collector_that_never_returns_leaves_the_pool(fleet_run):
    go, store = fleet_run
    first = go("redisync-tracking-expiring", 2, 2000, kill="1:40")
    assert np.abs(first[1]["own"][-1]).sum() > 0
    alone = go("redisync-tracking-expiring", 1, 600)  # restarted with one collector: shard 1 never comes back
    # stale_after_s=2: a fold drops the dead collector's slot once it is 2 s old, so from 2.5 s into the
    # restarted run its frozen EMA is not in what collector 0 samples from (600 iterations: 150 once ended
    # within 2.5 s on a fast run, leaving nothing to check)
    late = alone[0]["time"] > alone[0]["time"][0] + 2.5
    assert late.any(), f"the restarted run lasted only {alone[0]['time'][-1] - alone[0]['time'][0]:.1f} s"
    assert np.abs(alone[0]["fleet"][late]).sum() == 0
    _, count = pooled_sum(store)
    assert count <= 1


def test_the_readmes_motrix_env_block_defines_a_synced_env():
    import re

    from redisync.integrations.motrix import SyncedAdaptiveSampling

    from .test_readme import README

    text = README.read_text()
    marker = "<!-- the MotrixLab env: tests/test_frameworks_motrix.py runs this block -->"
    block = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    env_cls = scope["MyTrackingEnv"]
    assert issubclass(env_cls, SyncedAdaptiveSampling) and env_cls.redisync_stale_after_s == 30.0
    env = env_cls(TrackingCfg(), num_envs=2)  # outside a collector process: no fleet, local sampling
    assert env.redisync_fleet is None


def test_broadcast_collectors_sample_from_the_owners_ema(fleet_run):
    go, _ = fleet_run
    traces = go("redisync-tracking-broadcast", 2, 150)
    owner, other = traces[0], traces[1]
    for cdf, own in zip(owner["cdf"], owner["own"]):  # the owner (shard 0) samples from its own EMA
        np.testing.assert_allclose(cdf, command_cdf(own), rtol=1e-5, atol=1e-6)
    received = other["version"] > 0
    assert received.any()
    for cdf, fleet in zip(other["cdf"][received], other["fleet"][received]):  # the other from the owner's
        np.testing.assert_allclose(cdf, command_cdf(fleet.astype(np.float32)), rtol=1e-5, atol=1e-6)
    assert np.abs(other["fleet"][-1] - other["own"][-1]).sum() > 0  # which is not its own
