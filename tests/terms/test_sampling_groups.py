"""The sampler over many motions or env profiles, and the paper's uniform floor.

The oracle is written here: one unsharded ungrouped sampler per group, fed the whole stream of its
group. Sharded grouped samplers, each shard running its own mix of groups and syncing through the
store, must sample every group from exactly what that oracle uses.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from redisync.collector.seam import schema_of
from redisync.errors import InvalidSchema
from redisync.learner import FleetMonitor
from redisync.terms.torch import AdaptiveMotionSampler

from ..support import sync

F64 = torch.float64
STEP_DT = 0.02
FRAMES = (349, 149, 999, 50)  # 7, 3, 20 and 2 bins: groups of different lengths


def _failures(g: torch.Generator, ts: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Each group fails most in its own late segment, at its own rate."""
    frames = torch.tensor(FRAMES)[groups]
    hard = ts > (0.6 + 0.1 * groups) * frames
    return torch.rand(ts.shape[0], generator=g) < 0.02 + (0.1 + 0.1 * groups) * hard


@pytest.mark.parametrize("mix", ["code", "paper"])
@pytest.mark.parametrize("kernel_size", [1, 3])
def test_each_group_pooled_across_shards_equals_one_unsharded_sampler_of_that_group(make_store, mix, kernel_size):
    """Each motion group of a grouped sampler, pooled across shards, equals one unsharded sampler of that
    motion."""
    n_shards, envs = 3, 96
    kw = dict(uniform_mix=mix, kernel_size=kernel_size, alpha=0.05, dtype=F64)
    oracles = [AdaptiveMotionSampler(f, STEP_DT, mode="local", **kw) for f in FRAMES]
    shards = [
        AdaptiveMotionSampler(FRAMES, STEP_DT, mode="pooled", shard_id=i, rebuild_tol=0.0, **kw)
        for i in range(n_shards)
    ]
    store = make_store()
    store.register(schema_of([shards[0]]))
    clients = [store.shard(i) for i in range(n_shards)]
    g = torch.Generator().manual_seed(5)
    # an arbitrary mix per shard: shard 0 runs groups 0 and 1, shard 1 every group, shard 2 only group 2
    mixes = [torch.tensor([0, 1]), torch.tensor([0, 1, 2, 3]), torch.tensor([2])]
    group_of_env = [m[torch.randint(0, len(m), (envs,), generator=g)] for m in mixes]
    starts = [s.sample(envs, group_of_env[i], generator=g) for i, s in enumerate(shards)]
    for step in range(1, 121):
        for i, sampler in enumerate(shards):
            ts, groups = starts[i] + step % 40, group_of_env[i]
            ts = torch.minimum(ts, torch.tensor(FRAMES)[groups] - 1)
            failed = _failures(g, ts, groups)
            sampler.record_failures(ts, failed, groups)
            sampler.step()
            for k, oracle in enumerate(oracles):
                mine = groups == k
                oracle._current_bin_failed += torch.bincount(
                    oracle.bin_of(ts[mine])[failed[mine]], minlength=oracle.bin_count
                )
        for oracle in oracles:
            oracle.step()
        if step % 30 == 0:
            sync(store, clients, [[s] for s in shards])
            for sampler in shards:
                probs = sampler.probabilities()
                for k, oracle in enumerate(oracles):
                    b = oracle.bin_count
                    np.testing.assert_allclose(probs[k, :b], oracle.probabilities(), rtol=1e-9, atol=1e-12)
                    assert float(probs[k, b:].abs().sum()) == 0.0  # nothing past a group's own bins
            starts = [s.sample(envs, group_of_env[i], generator=g) for i, s in enumerate(shards)]
    # the groups really differ (the test could not pass with one distribution for all)
    assert float((oracles[0].probabilities() - oracles[0].probabilities().mean()).abs().max()) > 1e-3


@pytest.mark.parametrize("mode", ["local", "pooled"])
def test_paper_mix_keeps_the_floor_and_is_scale_invariant(make_store, mode):
    """The paper's uniform mix keeps every bin's floor (a group with no failure samples uniformly) and gives
    the same distribution when the EMA is scaled, alone or pooled."""
    lam = 0.2
    kw = dict(uniform_mix="paper", uniform_ratio=lam, kernel_size=3, rebuild_tol=0.0, dtype=F64)
    g = torch.Generator().manual_seed(1)
    offsets = AdaptiveMotionSampler(FRAMES, STEP_DT).layout.offsets
    ema = torch.rand(sum(AdaptiveMotionSampler(FRAMES, STEP_DT).bin_counts), generator=g, dtype=F64) ** 4
    ema[offsets[3] :] = 0.0  # a group with no failure at all samples uniformly
    store = make_store()

    def probabilities_at(scale: float) -> torch.Tensor:
        if mode == "local":
            sampler = AdaptiveMotionSampler(FRAMES, STEP_DT, mode="local", **kw)
            sampler.bin_failed_count.copy_(ema * scale)
            return sampler.probabilities()
        # pooled: a third of the failures from this shard, two thirds from the rest of the fleet
        shards = [AdaptiveMotionSampler(FRAMES, STEP_DT, shard_id=i, **kw) for i in range(2)]
        store.delete()
        store.register(schema_of([shards[0]]))
        shards[0].bin_failed_count.copy_(ema * scale / 3)
        shards[1].bin_failed_count.copy_(ema * scale * 2 / 3)
        sync(store, [store.shard(0), store.shard(1)], [[s] for s in shards])
        return shards[0].probabilities()

    base = probabilities_at(1.0)
    bins = torch.tensor(AdaptiveMotionSampler(FRAMES, STEP_DT).bin_counts, dtype=F64)
    real = torch.arange(base.shape[1]) < bins.long().unsqueeze(1)
    assert bool((base[real] >= (lam / bins).unsqueeze(1).expand_as(base)[real] * (1 - 1e-12)).all())
    np.testing.assert_allclose(base.sum(dim=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(base[3, :2], 0.5, rtol=1e-12)
    for scale in (1e-6, 7.0, 1e4, 1e300):  # 1e300 crosses the overflow guard
        np.testing.assert_allclose(probabilities_at(scale), base, rtol=1e-9, atol=1e-15)


def test_the_code_formula_depends_on_the_failure_scale():
    """The reason for the paper's mix: with the code's, a shard seeing 1/N of the failures is flatter."""
    ema = torch.zeros(20, dtype=F64)
    ema[15] = 0.5  # the fleet's failures, all in one bin
    top = {}
    for mix in ("code", "paper"):
        fleet = AdaptiveMotionSampler(999, STEP_DT, mode="local", uniform_mix=mix, dtype=F64)
        shard = AdaptiveMotionSampler(999, STEP_DT, mode="local", uniform_mix=mix, dtype=F64)
        fleet.bin_failed_count.copy_(ema)
        shard.bin_failed_count.copy_(ema / 16)  # one of 16 shards
        top[mix] = fleet.metrics()["sampling_top1_prob"], shard.metrics()["sampling_top1_prob"]
        if mix == "paper":
            np.testing.assert_allclose(fleet.probabilities(), shard.probabilities(), rtol=1e-12)
    assert top["code"][0] > 2 * top["code"][1]


def test_one_group_is_the_ungrouped_sampler():
    """A grouped sampler of one group is the ungrouped sampler, step for step."""
    one = AdaptiveMotionSampler(FRAMES[2], STEP_DT, mode="local", kernel_size=3)
    grouped = AdaptiveMotionSampler(FRAMES[2:3], STEP_DT, mode="local", kernel_size=3)
    g = torch.Generator().manual_seed(2)
    for _ in range(50):
        ts = torch.randint(0, FRAMES[2], (64,), generator=g)
        failed = torch.rand(64, generator=g) < 0.1 + 0.5 * (ts > 700)
        one.record_failures(ts, failed)
        grouped.record_failures(ts, failed, torch.zeros(64, dtype=torch.long))
        one.step()
        grouped.step()
    assert torch.equal(one.bin_failed_count, grouped.bin_failed_count)
    assert torch.equal(one.probabilities(), grouped.probabilities()[0])
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(one.sample(32, generator=a), grouped.sample(32, generator=b))  # one group: no group_ids needed


def test_grouped_draws_follow_each_groups_distribution():
    """Draws stay inside their env's motion and follow its group's distribution; groups are drawn by their
    failure mass, each at least its floor."""
    sampler = AdaptiveMotionSampler(FRAMES, STEP_DT, mode="local", group_uniform_ratio=0.4)
    sampler.bin_failed_count.copy_(torch.rand(sampler.bin_count, generator=torch.Generator().manual_seed(4)) ** 3)
    sampler.bin_failed_count[sampler.layout.offsets[1] : sampler.layout.offsets[2]] *= (
        20  # group 1 holds most failure mass
    )
    probs = sampler.probabilities()
    n = 200_000
    groups = torch.arange(n) % len(FRAMES)
    g = torch.Generator().manual_seed(9)
    ts = sampler.sample(n, groups, generator=g)
    frames = torch.tensor(FRAMES)[groups]
    assert bool((ts >= 0).all())
    assert bool((ts < frames).all())
    bins = sampler.sample_bins(n, groups, generator=g)
    for k, b in enumerate(sampler.bin_counts):
        freq = torch.bincount(bins[groups == k], minlength=b).double() / (n // len(FRAMES))
        np.testing.assert_allclose(freq, probs[k, :b].double(), atol=0.01)
    drawn = torch.bincount(sampler.sample_groups(n, generator=g), minlength=len(FRAMES)).double() / n
    weights = sampler.group_probabilities().double()
    np.testing.assert_allclose(drawn, weights, atol=0.01)
    assert float(weights.min()) >= 0.4 / len(FRAMES) - 1e-7
    assert int(weights.argmax()) == 1


def test_bad_groups_are_refused_with_what_was_wrong():
    """Group ids that are missing, of the wrong shape or out of range are refused, saying what was wrong."""
    sampler = AdaptiveMotionSampler(FRAMES, STEP_DT)
    with pytest.raises(ValueError, match="pass group_ids"):
        sampler.sample(4)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        sampler.sample(4, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 4\).*\[0, 7\]"):
        sampler.record_failures(torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool), torch.tensor([0, 7]))
    with pytest.raises(InvalidSchema, match="2 names for 4 groups"):
        AdaptiveMotionSampler(FRAMES, STEP_DT, group_names=["a", "b"])
    with pytest.raises(InvalidSchema, match="uniform_mix"):
        AdaptiveMotionSampler(FRAMES, STEP_DT, uniform_mix="blend")
    with pytest.raises(InvalidSchema, match="at most 1"):
        AdaptiveMotionSampler(FRAMES, STEP_DT, uniform_mix="paper", uniform_ratio=1.5)
    assert float(sampler.bin_failed_count.abs().sum()) == 0.0  # nothing was recorded


def test_metrics_stay_bounded_and_name_the_worst_groups():
    """With hundreds of groups the sampler's metrics stay few and name the worst groups."""
    names = [f"clip{g:03d}" for g in range(200)]
    sampler = AdaptiveMotionSampler([299] * 200, STEP_DT, mode="local", group_names=names, worst_groups=3)
    sampler.bin_failed_count[sampler.layout.offsets[17] + 2] = 50.0  # clip017 concentrates on one bin
    metrics = sampler.metrics()
    assert len(metrics) <= 6 + 2 * 3 + 4  # (and the EMA's mass and three statistics, for its worst group)
    assert "sampling_entropy/clip017" in metrics
    assert metrics["sampling_entropy_min"] == metrics["sampling_entropy/clip017"]
    assert metrics["sampling_top1_prob_max"] > 0.9
    assert metrics["drift_tv_max"] == 0.0


def test_the_learner_sees_every_groups_pooled_distribution(make_store):
    """The learner reads every group's pooled distribution from the store."""
    names = [f"motion{g}" for g in range(len(FRAMES))]
    shards = [
        AdaptiveMotionSampler(FRAMES, STEP_DT, shard_id=i, rebuild_tol=0.0, group_names=names, dtype=F64)
        for i in range(2)
    ]
    store = make_store()
    store.register(schema_of([shards[0]]))
    shards[0].record_failures(torch.tensor([300, 310]), torch.tensor([True, True]), torch.tensor([0, 0]))
    shards[1].record_failures(torch.tensor([10]), torch.tensor([True]), torch.tensor([2]))
    for s in shards:
        s.step()
    sync(store, [store.shard(0), store.shard(1)], [[s] for s in shards])
    learner_view = AdaptiveMotionSampler(FRAMES, STEP_DT, group_names=names, dtype=F64)  # the same config, no slot
    monitor = FleetMonitor(store, terms=[learner_view])
    monitor.refresh()
    distributions = monitor.distributions()
    np.testing.assert_allclose(distributions["motion/bin_failed"], shards[1].probabilities(), rtol=1e-12)
    metrics = monitor.metrics()
    assert (
        metrics["redisync/motion/bin_failed/sampling_entropy/motion0"]
        == metrics["redisync/motion/bin_failed/sampling_entropy_min"]
    )
    assert "redisync/fleet_version" in metrics


def test_every_grouped_draw_lies_inside_its_group_and_its_motion():
    """A group whose float32 probabilities sum to a little more than 1 (about 3e-8 from rounding;
    exaggerated here so that a few thousand draws meet it) must not push the next group's draws to
    bin -1, a negative start frame."""
    sampler = AdaptiveMotionSampler(FRAMES, STEP_DT, mode="local")
    sampler.probabilities()
    sampler._probs = sampler._probs.clone()
    sampler._probs[:-1] *= 1.01  # every group but the last sums to 1.01
    sampler._cdf = None
    g = torch.Generator().manual_seed(0)
    for group in range(1, len(FRAMES)):
        ids = torch.full((20_000,), group)
        bins = sampler.sample_bins(20_000, ids, generator=g)
        assert int(bins.min()) >= 0
        assert int(bins.max()) < sampler.bin_counts[group]
        frames = sampler.sample(20_000, ids, generator=g)
        assert int(frames.min()) >= 0
        assert int(frames.max()) < FRAMES[group]
