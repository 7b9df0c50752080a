"""One adaptive sampler in two array libraries: the same options, modes, numbers and metrics."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
import torch

from redisync.errors import InvalidSchema
from redisync.terms import numpy as rnp
from redisync.terms.sampler_options import MODES, SamplerOptions
from redisync.terms.torch import AdaptiveMotionSampler as TorchSampler

from ..support import sync
from .test_numpy_terms import feed

OWN = {TorchSampler: {"device", "dtype"}, rnp.AdaptiveMotionSampler: {"dtype", "ema", "cdf"}}


@pytest.mark.parametrize("sampler", list(OWN), ids=["torch", "numpy"])
def test_both_samplers_name_every_option_with_its_one_default(sampler):
    """Each sampler's signature is the declared options (same names, same defaults, each described)
    plus only what its array library needs: an option added to one and not the other fails here."""
    params = dict(inspect.signature(sampler.__init__).parameters)
    options = {f.name: f.default for f in dataclasses.fields(SamplerOptions)}
    own = set(params) - set(options) - {"self", "num_frames", "step_dt"}
    assert own == OWN[sampler]
    for name, default in options.items():
        assert params[name].default == default, name
        assert f"{name}:" in (sampler.__doc__ or ""), f"{name} is not described"
        assert f"{name}:" in (SamplerOptions.__doc__ or ""), f"{name} is not explained"


@pytest.mark.parametrize("sampler", list(OWN), ids=["torch", "numpy"])
def test_both_samplers_refuse_the_same_bad_options(sampler):
    """The checks are the declaration's: an unknown mode, a negative tolerance, a name too few."""
    for bad, message in [
        ({"mode": "sharded"}, "sampler mode must be one of"),
        ({"rebuild_tol": -1.0}, "rebuild_tol must be >= 0"),
        ({"group_names": ["a"]}, "group_names has 1 names for 2 groups"),
        ({"uniform_mix": "both"}, "uniform_mix must be one of"),
    ]:
        with pytest.raises(InvalidSchema, match=message):
            sampler((300, 450), 0.02, **bad)
    for mode in MODES:
        assert sampler((300, 450), 0.02, mode=mode).mode == mode


def test_weighted_numpy_shards_blend_as_the_torch_ones_do(make_store):
    """``weighted`` (the failure-weighted mean written into the own EMA at the boundary) was the
    torch sampler's only: two numpy shards and two torch shards fed the same failures hold the same
    EMAs after each exchange, and the numpy shards' EMAs are the caller's arrays, written in place."""
    frames = (300,)
    torch_shards = [TorchSampler(300, 0.02, mode="weighted", shard_id=i, dtype=torch.float64) for i in range(2)]
    arrays = [np.zeros(7, dtype=np.float64) for _ in range(2)]
    numpy_shards = [rnp.AdaptiveMotionSampler(300, 0.02, mode="weighted", shard_id=i, ema=arrays[i]) for i in range(2)]
    stores = [make_store(), make_store()]
    for store, shards in zip(stores, (torch_shards, numpy_shards), strict=True):
        store.register(dict(shards[0].schema_entries()))
    clients = [[store.shard(i) for i in range(2)] for store in stores]
    for round_ in range(3):
        for i in range(2):  # shard i sees its own failures (a different seed per shard and round)
            feed([torch_shards[i], numpy_shards[i]], frames, steps=40, seed=10 * round_ + i)
        sync(stores[0], clients[0], [[s] for s in torch_shards])
        sync(stores[1], clients[1], [[s] for s in numpy_shards])
        for t, n, array in zip(torch_shards, numpy_shards, arrays, strict=True):
            np.testing.assert_allclose(n.ema, t.bin_failed_count.numpy(), rtol=1e-12)
            assert n.ema is array
    assert not np.array_equal(arrays[0], np.zeros(7))
    np.testing.assert_allclose(arrays[0], arrays[1], rtol=1e-12)  # every shard holds the blend


def test_both_samplers_give_the_same_metrics_by_the_same_names():
    """Grouped, named and with ``worst_groups``: the numpy sampler's metrics (entropy, top bin,
    drift, the EMA's statistics) are the torch sampler's, name for name and number for number."""
    frames, names = (300, 450, 200), ["walk", "run", "jump"]
    kw = {"group_names": names, "worst_groups": 2, "mode": "local"}
    t = TorchSampler(frames, 0.02, dtype=torch.float64, **kw)
    n = rnp.AdaptiveMotionSampler(frames, 0.02, dtype=np.float64, **kw)
    feed([t, n], frames, steps=300, seed=4)
    tm, nm = t.metrics(), n.metrics()
    assert set(tm) == set(nm)
    assert "sampling_entropy/run" in nm or "sampling_entropy/walk" in nm
    for name, value in tm.items():
        assert nm[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_the_numpy_sampler_rebuilds_only_past_its_tolerance():
    """``rebuild_tol`` was the torch sampler's only: a numpy sampler rebuilt its CDF for any change.
    Now a move under the tolerance keeps the CDF (no rebuild), one over it rebuilds, and a
    ``local`` sampler rebuilds on any change (the unsynced algorithm, exactly)."""
    rng = np.random.default_rng(0)
    pooled = rnp.AdaptiveMotionSampler(300, 0.02, rebuild_tol=0.01, dtype=np.float64)
    local = rnp.AdaptiveMotionSampler(300, 0.02, mode="local", rebuild_tol=0.01, dtype=np.float64)
    for s in (pooled, local):
        s.ema[:] = 1.0
        s.sample(4, rng=rng)
        built = s.rebuilds
        s.ema[0] += 1e-4  # 1e-4 of a mass of 6: under 1 %
        s.sample(4, rng=rng)
        assert s.rebuilds == built + (1 if s is local else 0)
        s.ema[0] += 1.0  # ~16 % of the mass
        s.sample(4, rng=rng)
        assert s.rebuilds == built + (2 if s is local else 1)
