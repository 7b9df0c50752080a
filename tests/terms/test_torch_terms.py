"""The collector-side terms: exact to their public formulas when local, exact to an unsharded run when synced."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
from torch import nn

from redisync.collector.seam import schema_of
from redisync.store.schema import Schema
from redisync.terms.torch import (
    AdaptiveMotionSampler,
    AverageEpisodeLength,
    PenaltyCurriculum,
    SyncedEmpiricalNormalization,
    TerrainLevels,
)

from ..support import sync

F64 = torch.float64


# ----------------------------------------------------------------------------------- references


class BeyondMimicReference:
    """BeyondMimic's adaptive sampling formulas, written out again here as the oracle."""

    def __init__(self, num_frames, step_dt, alpha=0.001, ratio=0.1, k=1, lam=0.8, dtype=torch.float32):
        self.T, self.alpha, self.ratio = num_frames, alpha, ratio
        self.bins = int(num_frames // (1 / step_dt)) + 1
        self.ema = torch.zeros(self.bins, dtype=dtype)
        self.current = torch.zeros(self.bins, dtype=dtype)
        kernel = torch.tensor([lam**i for i in range(k)], dtype=dtype)
        self.kernel, self.k = kernel / kernel.sum(), k

    def reset(self, time_steps, failed):
        if torch.any(failed):
            bins = torch.clamp((time_steps * self.bins) // max(self.T, 1), 0, self.bins - 1)
            self.current[:] = torch.bincount(bins[failed], minlength=self.bins)

    def step(self):
        self.ema = self.alpha * self.current + (1 - self.alpha) * self.ema
        self.current.zero_()

    def probs(self):
        p = self.ema + self.ratio / float(self.bins)
        p = nn.functional.pad(p.unsqueeze(0).unsqueeze(0), (0, self.k - 1), mode="replicate")
        p = nn.functional.conv1d(p, self.kernel.view(1, 1, -1)).view(-1)
        return p / p.sum()

    def sample(self, n, generator):
        bins = torch.multinomial(self.probs(), n, replacement=True, generator=generator)
        u = torch.rand(n, generator=generator, dtype=self.ema.dtype)
        return ((bins + u) / self.bins * (self.T - 1)).long()


def rsl_rl_normalization():
    """rsl_rl's own EmpiricalNormalization, loaded from its file (its package pulls in far more than torch)."""
    spec = importlib.util.find_spec("rsl_rl")
    if spec is None:
        pytest.fail("rsl-rl-lib is not installed (scripts/setup installs it for the tests)")
    path = spec.submodule_search_locations[0] + "/modules/normalization.py"
    module_spec = importlib.util.spec_from_file_location("rsl_rl_normalization", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.EmpiricalNormalization


# ----------------------------------------------------------------------------------- local = public formulas


@pytest.mark.parametrize("kernel_size", [1, 3])
def test_local_sampler_reproduces_beyondmimic_step_for_step(kernel_size):
    """Unsynced, the sampler is BeyondMimic's, step for step: the same bins, EMA, probabilities and draws from
    the same generator."""
    ours = AdaptiveMotionSampler(1234, 0.02, mode="local", kernel_size=kernel_size)
    ref = BeyondMimicReference(1234, 0.02, k=kernel_size)
    assert ours.bin_count == ref.bins == 25
    data = torch.Generator().manual_seed(1)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for step in range(400):
        ts = torch.randint(0, 1234, (64,), generator=data)
        failed = torch.rand(64, generator=data) < (0.02 + 0.2 * (ts > 800))
        if step % 3 == 0:
            ours.record_failures(ts, failed)
            ref.reset(ts, failed)
            assert torch.equal(ours.sample(16, generator=g1), ref.sample(16, g2))
        assert torch.equal(ours.probabilities(), ref.probs())
        ours.step()
        ref.step()
        assert torch.equal(ours.bin_failed_count, ref.ema)
    m = ours.metrics()
    p = ref.probs()
    assert m["sampling_entropy"] == pytest.approx(float(-(p * (p + 1e-12).log()).sum() / math.log(25)))
    assert m["sampling_top1_bin"] == pytest.approx(float(p.argmax()) / 25)
    assert m["drift_tv"] == 0.0


def test_local_normaliser_is_rsl_rl():
    """Unsynced, the normaliser is rsl_rl's EmpiricalNormalization: the same mean, var, std and count after
    every update, bit for bit."""
    Reference = rsl_rl_normalization()
    ours, ref = SyncedEmpiricalNormalization(5, until=3000, mode="local"), Reference(5, until=3000)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        x = torch.randn(97, 5, generator=g) * 3 + 2
        ours.update(x)
        ref.update(x)
        for name in ("_mean", "_var", "_std", "count"):
            assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    assert torch.equal(ours(x), ref(x))
    assert torch.equal(ours.inverse(x), ref.inverse(x))
    # state dicts move both ways, pooled modes included
    assert set(ours.state_dict()) == set(ref.state_dict()) == {"_mean", "_var", "_std", "count"}
    pooled = SyncedEmpiricalNormalization(5, mode="pooled")
    pooled.load_state_dict(ref.state_dict())
    fresh = Reference(5)
    fresh.load_state_dict(pooled.state_dict())
    assert torch.equal(fresh._mean, ref._mean)
    assert int(fresh.count) == int(ref.count)


def test_a_pooled_normaliser_resumes_from_its_checkpoint_until_the_store_holds_as_much(make_store):
    """A checkpoint's statistics are the prior: on an empty store the normaliser continues as
    rsl_rl's resumed one does; once the fleet holds more samples than the prior, the fleet's rule."""
    Reference = rsl_rl_normalization()
    g = torch.Generator().manual_seed(11)
    ref = Reference(3)
    for _ in range(4):
        ref.update(torch.randn(100, 3, generator=g) * 2 + 5)
    resumed = SyncedEmpiricalNormalization(3, mode="pooled")
    resumed.load_state_dict(ref.state_dict())
    assert not resumed.resumed  # the prior is not the shard's own history: nothing in the store is taken over
    x = torch.randn(50, 3, generator=g)
    resumed.update(x)
    ref.update(x)
    torch.testing.assert_close(resumed._mean, ref._mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(resumed._var, ref._var, rtol=1e-5, atol=1e-6)
    assert int(resumed.count) == int(ref.count) == 450
    assert resumed.report_shard_state()["obs/norm"]["count"] == 50  # the prior is never reported
    # a fleet that holds more than the prior: its statistics take over
    store = make_store()
    other = SyncedEmpiricalNormalization(3, mode="pooled")
    other.update(torch.randn(1000, 3, generator=g) - 7)
    store.register(schema_of([other]))
    sync(store, [store.shard(0), store.shard(1)], [[resumed], [other]])
    assert int(resumed.count) == 1050
    torch.testing.assert_close(resumed._mean, other._mean)


def test_holosoma_tracker_and_penalty_rules():
    """The episode-length tracker and the penalty curriculum follow holosoma's rules: its window scaled from
    its env count, its weight min(n / N, 1), its step up and down and its clip."""
    assert AverageEpisodeLength(num_envs=1024).window == 250  # holosoma's window: scaled from its 4 096 envs
    tracker = AverageEpisodeLength(num_envs=4096, num_compute_average_epl=1000, base_num_envs=2048)
    assert tracker.window == 2000
    avg = 0.0
    for lengths in ([100.0] * 500, [400.0] * 3000, [50.0] * 10):
        tracker.update(torch.tensor(lengths))
        w = min(len(lengths) / 2000, 1.0)
        avg = avg * (1 - w) + float(np.mean(lengths)) * w
        assert tracker.value == pytest.approx(avg, rel=1e-6)
    pen = PenaltyCurriculum(
        initial_scale=0.5, min_scale=0.1, max_scale=1.0, level_down_threshold=150, level_up_threshold=750, degree=0.1
    )
    assert pen.update(100) == pytest.approx(0.45)
    assert pen.update(500) == pytest.approx(0.45)
    assert pen.update(900) == pytest.approx(0.495)
    for _ in range(100):
        pen.update(10)
    assert pen.scale == 0.1
    # holosoma clips an initial scale outside [min, max] before any reward uses it
    assert PenaltyCurriculum(initial_scale=2.0, max_scale=1.0).scale == 1.0
    restored = PenaltyCurriculum(min_scale=0.1)
    restored.load_state_dict(pen.state_dict())
    assert restored.scale == 0.1
    restored.load_state_dict({"reward_penalty_scale": 0.7})  # holosoma's checkpoint entry
    assert restored.scale == 0.7


def test_the_tracker_resumes_from_its_state_dict_and_broadcasts_the_owners_average(make_store):
    """A tracker resumes its own average and episode count from its state dict (marked resumed) and skips the
    batch after a restore, as holosoma does; in broadcast mode every shard takes the owner's average."""
    tracker = AverageEpisodeLength(num_envs=1024)
    tracker.update(torch.full((100,), 300.0))
    restored = AverageEpisodeLength(num_envs=1024, mode="pooled")
    restored.load_state_dict(tracker.state_dict())
    assert restored.own_average == pytest.approx(tracker.own_average)
    assert restored.episodes == 100
    assert restored.resumed
    restored.suppress_next_update()
    restored.update(torch.full((10,), 1.0))  # skipped, as holosoma skips the batch after a restore
    assert restored.own_average == pytest.approx(tracker.own_average)
    store = make_store()
    owner, other = (AverageEpisodeLength(1024, mode="broadcast", shard_id=i, owner=0) for i in (0, 1))
    owner.update(torch.full((300,), 800.0))
    other.update(torch.full((300,), 20.0))
    store.register(schema_of([owner]))
    sync(store, [store.shard(0), store.shard(1)], [[owner], [other]])
    assert other.value == owner.value == owner.own_average != other.own_average


def test_terrain_levels_follow_isaaclab():
    """Terrain levels move as Isaac Lab's do: up on success, down on failure, clipped, the top level sent to a
    random level."""
    g = torch.Generator().manual_seed(0)
    terrain = TerrainLevels(6, num_levels=5, generator=g)
    terrain.levels[:] = torch.tensor([0, 0, 2, 4, 4, 3])
    ids = torch.arange(6)
    terrain.update(ids, torch.tensor([0, 1, 1, 1, 0, 0]), torch.tensor([1, 0, 0, 0, 1, 0]))
    lv = terrain.levels
    assert lv[0] == 0
    assert lv[1] == 1
    assert lv[2] == 3
    assert lv[4] == 3
    assert lv[5] == 3
    assert 0 <= lv[3] < 5
    assert terrain.histogram().sum() == 6


# ----------------------------------------------------------------------------------- synced = unsharded


@pytest.mark.parametrize("n_shards", [1, 2, 4, 8])
def test_sharded_terms_equal_one_unsharded_term(make_store, n_shards):
    """N synced shards hold what one unsharded process of all their envs holds: the sampler's pooled EMA and
    the normaliser's moments."""
    envs, frames = 64, 600
    single_sampler = AdaptiveMotionSampler(frames, 0.02, mode="local", dtype=F64)
    single_norm = SyncedEmpiricalNormalization(4, mode="pooled")  # alone: its own statistics of every sample
    samplers = [
        AdaptiveMotionSampler(frames, 0.02, mode="pooled", shard_id=i, rebuild_tol=0.0, dtype=F64)
        for i in range(n_shards)
    ]
    norms = [SyncedEmpiricalNormalization(4, mode="pooled") for _ in range(n_shards)]
    store = make_store()
    store.register(schema_of([samplers[0], norms[0]]))
    clients = [store.shard(i) for i in range(n_shards)]
    slices = np.array_split(np.arange(envs), n_shards)
    g = torch.Generator().manual_seed(n_shards)
    for step in range(1, 301):
        ts = torch.randint(0, frames, (envs,), generator=g)
        failed = torch.rand(envs, generator=g) < (0.01 + 0.3 * (ts > 450))
        obs = torch.randn(envs, 4, generator=g, dtype=F64) * torch.tensor([1.0, 10.0, 0.1, 3.0], dtype=F64) + 5
        single_sampler.record_failures(ts, failed)
        single_sampler.step()
        single_norm.update(obs)
        for sampler, norm, sl in zip(samplers, norms, slices, strict=False):
            sampler.record_failures(ts[sl], failed[sl])
            sampler.step()
            norm.update(obs[sl])
        if step % 100 == 0:
            sync(store, clients, [[s, n] for s, n in zip(samplers, norms, strict=False)])
            want_mean, want_var, want_n = single_norm.pooled_moments()
            for sampler, norm in zip(samplers, norms, strict=False):
                np.testing.assert_allclose(
                    sampler.sampling_ema(), single_sampler.bin_failed_count, rtol=1e-9, atol=1e-15
                )
                np.testing.assert_allclose(sampler.probabilities(), single_sampler.probabilities(), rtol=1e-9)
                mean, var, n = norm.pooled_moments()
                assert n == want_n == envs * step
                np.testing.assert_allclose(mean, want_mean, rtol=1e-9)
                np.testing.assert_allclose(var, want_var, rtol=1e-9)
                assert int(norm.count) == want_n
                np.testing.assert_allclose(norm._mean, single_norm._mean, rtol=1e-6)


def test_between_syncs_a_shard_sees_others_as_pulled_plus_itself_now(make_store):
    """Between two pulls a shard acts on the others' data as pulled plus all of its own up to now (own
    substitution)."""
    a, b = (AdaptiveMotionSampler(100, 0.1, mode="pooled", shard_id=i, rebuild_tol=0.0, dtype=F64) for i in range(2))
    store = make_store()
    store.register(schema_of([a]))
    clients = [store.shard(0), store.shard(1)]
    b.record_failures(torch.tensor([95]), torch.tensor([True]))
    b.step()
    sync(store, clients, [[a], [b]])
    a.record_failures(torch.tensor([5]), torch.tensor([True]))
    a.step()  # after the pull: only a's own view knows this
    np.testing.assert_allclose(a.sampling_ema(), a.bin_failed_count + b.bin_failed_count, rtol=1e-12)
    assert a.metrics()["drift_tv"] > 0.0


def test_weighted_and_broadcast_sampler_modes(make_store):
    """The weighted mode's fleet EMA is the failure-weighted mean of the shards' blended EMAs; the broadcast
    mode's is the owner's own EMA."""
    store = make_store()
    weighted = [AdaptiveMotionSampler(100, 0.1, mode="weighted", shard_id=i, dtype=F64) for i in range(2)]
    store.register(schema_of([weighted[0]]))
    clients = [store.shard(0), store.shard(1)]
    weighted[0].record_failures(torch.tensor([5, 15, 25]), torch.tensor([True, True, True]))  # 3 failures
    weighted[1].record_failures(torch.tensor([95]), torch.tensor([True]))  # 1 failure
    for s in weighted:
        s.step()
    own = [s.bin_failed_count.clone() for s in weighted]
    sync(store, clients, [[weighted[0]], [weighted[1]]])
    want = (3 * own[0] + 1 * own[1]) / 4  # the failure-weighted mean overwrites each shard's EMA
    for s in weighted:
        np.testing.assert_allclose(s.bin_failed_count, want, rtol=1e-12)

    store2 = store.__class__(store.redis, store.run + "-b", store.url)
    owner, other = (AdaptiveMotionSampler(100, 0.1, mode="broadcast", shard_id=i, owner=0, dtype=F64) for i in range(2))
    store2.register(schema_of([owner]))
    try:
        owner.record_failures(torch.tensor([55]), torch.tensor([True]))
        owner.step()
        other.record_failures(torch.tensor([5]), torch.tensor([True]))
        other.step()
        assert other.report_shard_state() == {}
        sync(store2, [store2.shard(0), store2.shard(1)], [[owner], [other]])
        assert torch.equal(other.probabilities(), owner.probabilities())
    finally:
        store2.delete()


def test_curriculum_terms_sync(make_store):
    """Synced curriculum terms: the episode-length tracker's value is every shard's average weighted as
    holosoma weights one shard's, the penalty scale is the owner's (a non-owner's opinion ignored), terrain
    levels pool their histograms."""
    store = make_store()
    trackers = [AverageEpisodeLength(100, 100, base_num_envs=None, mode="pooled") for _ in range(3)]
    pens = [PenaltyCurriculum(0.5, degree=0.1, mode="broadcast", shard_id=i, owner=0) for i in range(3)]
    terrains = [TerrainLevels(10, 4, mode="pooled", generator=torch.Generator().manual_seed(i)) for i in range(3)]
    store.register(schema_of([trackers[0], pens[0], terrains[0]]))
    clients = [store.shard(i) for i in range(3)]
    for i, t in enumerate(trackers):
        t.update(torch.full((50 * (i + 1),), 100.0 * (i + 1)))
    pens[0].update(1000)  # the owner decides: up
    pens[1].update(10)  # a non-owner's own opinion is ignored
    sync(store, clients, [[t, p, r] for t, p, r in zip(trackers, pens, terrains, strict=False)])
    fleet_avg = sum(min(50 * (i + 1), 100) * t.own_average for i, t in enumerate(trackers)) / (50 + 100 + 100)
    assert all(t.value == pytest.approx(fleet_avg) for t in trackers)
    assert all(p.scale == pytest.approx(0.55) for p in pens)
    hist = sum(t.histogram() for t in terrains)
    for t in terrains:
        np.testing.assert_array_equal(t.fleet_histogram(), hist)
        assert t.mean_level() == pytest.approx(float((hist * np.arange(4)).sum() / 30))


def test_two_terms_may_not_claim_one_key():
    """Two terms declaring one key is an invalid schema; terms with their own keys make one schema."""
    from redisync.errors import InvalidSchema

    with pytest.raises(InvalidSchema, match="declared by two terms"):
        schema_of([AdaptiveMotionSampler(100, 0.1), AdaptiveMotionSampler(100, 0.1)])
    assert isinstance(
        schema_of([AdaptiveMotionSampler(100, 0.1, mode="local"), SyncedEmpiricalNormalization(2)]), Schema
    )


def test_learner_owned_normaliser_is_broadcast_to_collectors(make_store):
    """A normaliser owned by the learner is the learner's statistics in every collector, whatever the
    collectors saw."""
    from redisync.learner import FleetMonitor

    store = make_store()
    learner = SyncedEmpiricalNormalization(3, mode="learner", writer=True, owner=99)
    collectors = [SyncedEmpiricalNormalization(3, mode="learner", owner=99) for _ in range(2)]
    monitor = FleetMonitor(store, schema_of([learner]))
    g = torch.Generator().manual_seed(5)
    learner.update(torch.randn(500, 3, generator=g) * 2 + 1)
    collectors[0].update(torch.randn(10, 3, generator=g))  # a collector never writes the statistics
    assert int(collectors[0].count) == 0
    store.shard(99).publish(learner.report_shard_state())
    for i, c in enumerate(collectors):
        client = store.shard(i)
        client.pull()
        c.apply_shard_state(client.known)
        for name in ("_mean", "_var", "_std", "count"):
            assert torch.equal(getattr(c, name), getattr(learner, name)), name
    m = monitor.metrics()
    assert m["redisync/fleet_version"] == 1
    assert m["redisync/obs/norm/version"] == 1
    checkpoint = monitor.state_dict()
    store.shard(99).publish(learner.report_shard_state())
    monitor.load_state_dict(checkpoint)
    monitor.refresh()
    assert monitor.state.epoch_changed
    assert monitor.state.fleet_version > 2
