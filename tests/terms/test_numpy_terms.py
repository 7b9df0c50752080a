"""The numpy terms: the torch terms' algorithm on arrays the environment owns, written in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from redisync.collector.seam import schema_of
from redisync.errors import InvalidSchema
from redisync.terms import numpy as rnp
from redisync.terms.torch import AdaptiveMotionSampler as TorchSampler

from ..support import sync


def feed(samplers, frames, steps=200, seed=0, envs=48):
    """The same failures into every sampler (each given its own framework's arrays)."""
    rng = np.random.default_rng(seed)
    groups = len(frames)
    for _ in range(steps):
        g = rng.integers(0, groups, envs)
        ts = (rng.random(envs) * np.asarray(frames)[g]).astype(np.int64)
        failed = rng.random(envs) < 0.05 + 0.4 * (ts > 0.7 * np.asarray(frames)[g])
        for s in samplers:
            if isinstance(s, TorchSampler):
                s.record_failures(
                    torch.as_tensor(ts), torch.as_tensor(failed), torch.as_tensor(g) if s.grouped else None
                )
            else:
                s.record_failures(ts, failed, g if s.grouped else None)
            s.step()


@pytest.mark.parametrize("frames", [(600,), (300, 300), (149, 600, 250)])
@pytest.mark.parametrize("mix", ["code", "paper"])
@pytest.mark.parametrize("kernel_size", [1, 3])
def test_numpy_sampler_computes_what_the_torch_sampler_does(frames, mix, kernel_size):
    grouped = len(frames) > 1
    arg = frames if grouped else frames[0]
    kw = dict(mode="local", uniform_mix=mix, kernel_size=kernel_size, alpha=0.01)
    t = TorchSampler(arg, 0.02, **kw)
    n = rnp.AdaptiveMotionSampler(arg, 0.02, **kw)
    feed([t, n], frames)
    np.testing.assert_allclose(n.ema, t.bin_failed_count.numpy(), rtol=1e-6)
    assert n.ema.dtype == np.float32
    np.testing.assert_allclose(n.probabilities(), t.probabilities().numpy(), rtol=2e-5, atol=1e-8)
    np.testing.assert_allclose(n.group_probabilities(), t.group_probabilities().numpy(), rtol=1e-5)


def test_the_sampler_writes_the_callers_arrays_in_place():
    ema, cdf = np.zeros(13, dtype=np.float32), np.zeros(13, dtype=np.float32)
    s = rnp.AdaptiveMotionSampler(600, 0.02, mode="local", ema=ema, cdf=cdf)
    assert s.ema is ema
    assert s.cdf is cdf
    assert cdf[-1] == 1.0
    before = cdf.copy()
    feed([s], (600,), steps=50)
    s.rebuild()
    assert s.cdf is cdf
    assert not np.array_equal(cdf, before)
    np.testing.assert_allclose(np.diff(cdf, prepend=0), s.probabilities(), rtol=1e-5, atol=1e-7)
    starts = s.sample(4000, rng=np.random.default_rng(1))
    assert starts.min() >= 0
    assert starts.max() < 600
    late = np.mean(starts > 420)
    assert late > 0.5  # failures late in the motion pull the starts there


def test_a_wrong_caller_array_is_refused_naming_it():
    with pytest.raises(InvalidSchema, match="cdf must be a numpy array of 13 float32"):
        rnp.AdaptiveMotionSampler(600, 0.02, cdf=np.zeros(12, dtype=np.float32))
    frozen = np.zeros(13, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InvalidSchema, match="ema must be a writeable"):
        rnp.AdaptiveMotionSampler(600, 0.02, ema=frozen)
    with pytest.raises(ValueError, match=r"time_steps and failed must be 1-D of one length.*\(3,\) and \(2,\)"):
        rnp.AdaptiveMotionSampler(600, 0.02).record_failures(np.array([1, 2, 3]), np.array([True, False]))
    with pytest.raises(InvalidSchema, match="mode must be one of"):
        rnp.AdaptiveMotionSampler(600, 0.02, mode="weighted")


@pytest.mark.parametrize("n_shards", [2, 4])
def test_sharded_numpy_terms_equal_one_unsharded_term(make_store, n_shards):
    envs, frames = 64, (300, 450)
    single = rnp.AdaptiveMotionSampler(frames, 0.02, mode="local", dtype=np.float64)
    single_norm = rnp.EmpiricalNormalizer(3, mode="local", dtype=np.float64)
    samplers = [rnp.AdaptiveMotionSampler(frames, 0.02, shard_id=i) for i in range(n_shards)]
    norms = [rnp.EmpiricalNormalizer(3) for _ in range(n_shards)]
    store = make_store()
    store.register(schema_of([samplers[0], norms[0]]))
    clients = [store.shard(i) for i in range(n_shards)]
    slices = np.array_split(np.arange(envs), n_shards)
    rng = np.random.default_rng(n_shards)
    for step in range(1, 201):
        g = rng.integers(0, 2, envs)
        ts = (rng.random(envs) * np.asarray(frames)[g]).astype(np.int64)
        failed = rng.random(envs) < 0.02 + 0.3 * (ts > 250)
        obs = rng.normal(size=(envs, 3)) * [1.0, 10.0, 0.1] + 5
        single.record_failures(ts, failed, g)
        single.step()
        single_norm.update(obs)
        for s, norm, sl in zip(samplers, norms, slices, strict=False):
            s.record_failures(ts[sl], failed[sl], g[sl])
            s.step()
            norm.update(obs[sl])
        if step % 50 == 0:
            sync(store, clients, [[s, n] for s, n in zip(samplers, norms, strict=False)])
            for s, norm in zip(samplers, norms, strict=False):
                np.testing.assert_allclose(s.sampling_ema(), single.ema, rtol=1e-5, atol=1e-9)  # float32 shards
                np.testing.assert_allclose(s.probabilities(), single.probabilities(), rtol=1e-5, atol=1e-9)
                s.rebuild()
                single.rebuild()
                np.testing.assert_allclose(s.cdf, single.cdf, rtol=1e-5, atol=1e-6)
                assert norm.count == single_norm.count == envs * step
                np.testing.assert_allclose(norm.mean, single_norm.mean, rtol=1e-6)
                np.testing.assert_allclose(norm.std, single_norm.std, rtol=1e-5)


def test_write_sampling_ema_fills_a_kernels_array(make_store):
    a, b = (rnp.AdaptiveMotionSampler(100, 0.1, shard_id=i) for i in range(2))
    store = make_store()
    store.register(schema_of([a]))
    feed([b], (100,), steps=20, seed=3)
    sync(store, [store.shard(0), store.shard(1)], [[a], [b]])
    out = np.zeros(11, dtype=np.float32)
    a.write_sampling_ema(out)
    np.testing.assert_allclose(out, a.ema + b.ema, rtol=1e-6)


def test_a_grouped_ema_array_pools_bin_by_bin(make_store):
    """A command that keeps one row of bins per motion ([G, B]) is pooled per bin, whatever mix of
    motions each shard runs (the MotrixLab drop-in syncs such an array as it lies)."""
    own = [np.zeros((3, 5), dtype=np.float32) for _ in range(2)]
    own[0][0, 1], own[1][2, 4], own[1][0, 1] = 0.5, 0.25, 0.125
    terms = [rnp.FailureEma(a, shard_id=i) for i, a in enumerate(own)]
    store = make_store()
    store.register(schema_of([terms[0]]))
    assert store.schema.keys["motion/bin_failed"].shape == (3, 5)
    sync(store, [store.shard(0), store.shard(1)], [[terms[0]], [terms[1]]])
    for term in terms:
        np.testing.assert_array_equal(term.sampling_ema(), (own[0] + own[1]).astype(np.float64))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_unsynced_sampler_on_a_small_shard_warns_as_the_follow_up_decided(kind):
    """The pre-registered follow-up's P1 (docs/ab/follow-up-plan.md): unsynced shards of 64 envs with
    the code's mix did worse than pooled ones, so such a sampler says so once, at construction."""
    import warnings

    from redisync.terms.formulas import SmallUnsyncedShardWarning

    if kind == "torch":
        from redisync.terms.torch.sampler import AdaptiveMotionSampler as Sampler
    else:
        from redisync.terms.numpy.sampler import AdaptiveMotionSampler as Sampler
    with pytest.warns(SmallUnsyncedShardWarning, match="64 envs per shard"):
        Sampler(500, 0.02, mode="local", num_envs=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Sampler(500, 0.02, mode="local", num_envs=256)  # the size where no harm was shown
        Sampler(500, 0.02, mode="pooled", num_envs=64)  # synced
        Sampler(500, 0.02, mode="local", uniform_mix="paper", num_envs=64)  # the mix that does not flatten
        Sampler(500, 0.02, mode="local")  # the shard's size unknown
