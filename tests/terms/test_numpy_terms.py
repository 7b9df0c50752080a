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
    """The numpy sampler computes what the torch sampler does: the same EMA and distribution, for one motion
    or several, with any uniform mix and kernel."""
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
    """The numpy sampler keeps its EMA and CDF in the caller's arrays, written in place (a task's kernel reads
    them)."""
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
    """A caller's array of the wrong size, dtype or one not writeable is refused, naming the array and what it
    must be."""
    with pytest.raises(InvalidSchema, match="cdf must be a numpy array of 13 float32"):
        rnp.AdaptiveMotionSampler(600, 0.02, cdf=np.zeros(12, dtype=np.float32))
    frozen = np.zeros(13, dtype=np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InvalidSchema, match="ema must be a writeable"):
        rnp.AdaptiveMotionSampler(600, 0.02, ema=frozen)
    with pytest.raises(ValueError, match=r"time_steps and failed must be 1-D of one length.*\(3,\) and \(2,\)"):
        rnp.AdaptiveMotionSampler(600, 0.02).record_failures(np.array([1, 2, 3]), np.array([True, False]))
    with pytest.raises(InvalidSchema, match="mode must be one of"):
        rnp.AdaptiveMotionSampler(600, 0.02, mode="sharded")


@pytest.mark.parametrize("n_shards", [2, 4])
def test_sharded_numpy_terms_equal_one_unsharded_term(make_store, n_shards):
    """N synced numpy shards hold what one unsharded process of all their envs holds: the sampler's pooled EMA
    and the normaliser's moments."""
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
    """write_sampling_ema fills a caller's array with the fleet EMA the sampler acts on (the others' plus its
    own)."""
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


def test_the_ema_statistics_follow_from_the_formulas():
    """n = F / (B·α) failures per bin in the EMA's window, relative noise 1/sqrt(2n), uniform share
    ε / (F + ε) with the code's mix (ε with the paper's)."""
    from redisync.terms.formulas import ema_statistics, ema_warning

    stats = ema_statistics(0.64, 120, 0.01, 0.1, "code")
    assert stats["failures_per_bin_window"] == pytest.approx(0.64 / 1.2)
    assert stats["ema_relative_noise"] == pytest.approx((2 * 0.64 / 1.2) ** -0.5)
    assert stats["uniform_share"] == pytest.approx(0.1 / 0.74)
    assert ema_statistics(0.64, 120, 0.01, 0.1, "paper")["uniform_share"] == 0.1
    # a Poisson-fed EMA's relative noise, simulated: what the formula says
    rng = np.random.default_rng(0)
    f, alpha, ema, seen = 0.05, 0.01, 0.0, []
    for step in range(200_000):
        ema = alpha * rng.poisson(f) + (1 - alpha) * ema
        if step > 2_000:
            seen.append(ema)
    assert np.std(seen) / np.mean(seen) == pytest.approx(
        ema_statistics(f, 1, alpha, 0.1, "code")["ema_relative_noise"], rel=0.1
    )
    # one fleet split into 32 shards: the fleet's EMA is a fair guide (17 failures per bin), a shard's own is not
    fleet = ema_statistics(32 * 0.64, 120, 0.01, 0.1, "code")
    why = ema_warning(stats, fleet, "shard")
    assert why is not None
    assert "0.53 failures per bin" in why
    assert "relative noise of 0.97" in why
    assert ema_warning(fleet, fleet, "fleet") is None  # a fair EMA: nothing to say
    # split into 16, the pooled EMA would hold 8.5 failures per bin: not fair enough to promise a gain
    assert ema_warning(stats, ema_statistics(16 * 0.64, 120, 0.01, 0.1, "code"), "shard") is None
    # a policy that hardly fails: the fleet's EMA is poor too, and syncing would not help
    idle = ema_statistics(0.001, 120, 0.01, 0.1, "code")
    assert ema_warning(idle, ema_statistics(16 * 0.001, 120, 0.01, 0.1, "code"), "shard") is None


def feed_failures(sampler, steps: int, failures_per_step: float, torch_terms: bool) -> None:
    """``steps`` env steps in which, on average, ``failures_per_step`` envs fail, in random bins."""
    rng = np.random.default_rng(1)
    for _ in range(steps):
        k = rng.poisson(failures_per_step)
        if k:
            t = rng.integers(0, 500, size=k)
            if torch_terms:
                import torch

                sampler.record_failures(torch.as_tensor(t), torch.ones(k, dtype=torch.bool))
            else:
                sampler.record_failures(t, np.ones(k, dtype=bool))
        sampler.step()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_unsynced_sampler_warns_from_what_its_shard_sees(kind):
    """Not from the env count: from the failures its own EMA holds, once the EMA's window has filled,
    once, with the numbers; and its metrics say the same for a logger."""
    import warnings

    from redisync.terms.formulas import EmaStatisticsWarning

    if kind == "torch":
        from redisync.terms.torch.sampler import AdaptiveMotionSampler as Sampler
    else:
        from redisync.terms.numpy.sampler import AdaptiveMotionSampler as Sampler
    few = Sampler(500, 0.02, mode="local", alpha=0.01, fleet_shards=64)  # 10 bins, one of 64 shards
    feed_failures(few, 50, 0.05, kind == "torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        few.metrics()  # the EMA's window (100 steps) has not filled: nothing judged yet
    feed_failures(few, 200, 0.05, kind == "torch")
    with pytest.warns(
        EmaStatisticsWarning,
        match=r"failures per bin in the EMA's window, a relative noise of .* where the fleet's pooled EMA would have a relative noise of 0\.\d\d",
    ):
        metrics = few.metrics()
    assert metrics["ema_relative_noise"] > 0.5
    assert metrics["ema_uniform_share"] > 0.5  # 0.05 failures per step: the uniform part dominates too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        few.metrics()  # once
        many = Sampler(500, 0.02, mode="local", alpha=0.01, fleet_shards=64)
        feed_failures(many, 250, 20.0, kind == "torch")  # 20 failures per step: 200 per bin in the window
        assert many.metrics()["ema_relative_noise"] < 0.1
        synced = Sampler(500, 0.02, mode="pooled", alpha=0.01, fleet_shards=64)
        feed_failures(synced, 250, 0.05, kind == "torch")
        assert synced.metrics()["ema_relative_noise"] > 0.5  # what it would have alone, as a metric ...
        # ... but it samples from the fleet's failures: no warning
        alone = Sampler(500, 0.02, mode="local", alpha=0.01)  # its fleet's size unknown: nothing to compare
        feed_failures(alone, 250, 0.05, kind == "torch")
        alone.metrics()


def test_the_warning_fires_on_the_studys_small_unsynced_shards_and_not_on_its_single_collector():
    """The rule judged on the statistics recorded from the drift study's arms (one seed at the study's
    size, scripts/ema_statistics_arms.py): every shard of 64 envs with the code's mix warns at some
    record (its own EMA poor, the 16 shards' pooled EMA fair); the single collector of 1 024 envs,
    whose EMA is its fleet's, never does."""
    import json
    from pathlib import Path

    from redisync.terms.formulas import ema_statistics, ema_warning

    record = Path(__file__).resolve().parents[2] / "records" / "ab" / "ema-statistics-2026-12-02.txt"
    arms = {d["arm"]: d for d in (json.loads(line) for line in record.read_text().splitlines() if line.startswith("{"))}
    small, single = arms["local-16-shards"], arms["single"]
    assert len(small["ema"][0]["shards"]) == 16
    assert len(single["ema"][0]["shards"]) == 1
    for row in small["ema"]:  # the recorded fleet figures are the pooled sum of the shards' EMAs
        mass = sum(s["failures_per_bin_window"] for s in row["shards"]) * 120 * 0.01
        want = ema_statistics(mass, 120, 0.01, 0.1, "code")
        assert row["fleet"]["failures_per_bin_window"] == pytest.approx(want["failures_per_bin_window"], rel=1e-9)
    fired = [[ema_warning(s, row["fleet"], "shard") is not None for s in row["shards"]] for row in small["ema"]]
    assert all(any(shard) for shard in zip(*fired, strict=True))  # every small shard, at some record
    assert not any(ema_warning(s, row["fleet"], "shard") for row in single["ema"] for s in row["shards"])


def test_the_warning_fires_on_every_shard_of_the_second_follow_ups_128_env_arm_and_not_on_its_single_collector():
    """The rule judged on the second follow-up's committed runs (each run file keeps every shard's EMA
    statistics and the fleet's pooled ones at each drift record): each of the 8 shards of 128 envs
    of `local-8-shards` warns at some record, on every seed — the check its plan asked of the 128-env
    arm, so its thresholds stand — and the gate's single collector of 1 024 envs never does."""
    import json
    from pathlib import Path

    from redisync.terms.formulas import ema_warning

    runs = Path(__file__).resolve().parents[2] / "records" / "ab" / "second-follow-up" / "runs"

    def fired(name: str) -> list[list[list[bool]]]:
        out = []
        for path in sorted(runs.glob(f"H-{name}-*.json")):
            drift = json.loads(path.read_text())["run"]["drift"]
            out.append([[ema_warning(s, row["ema_fleet"], "shard") is not None for s in row["ema"]] for row in drift])
        return out

    small, single = fired("local-8-shards"), fired("single")
    assert len(small) == 10  # every seed of the arm
    assert len(single) == 3  # the gate's three
    for run in small:
        assert len(run[0]) == 8
        assert all(any(shard) for shard in zip(*run, strict=True))  # every shard, at some record
    assert not any(w for run in single for row in run for w in row)


def test_both_samplers_take_the_state_keys_lease_grace():
    """The torch and the numpy sampler declare their failure EMA with the grace they are given (each
    took it from its own defaults only, the torch one with no way to change it)."""
    from redisync.terms.numpy.sampler import AdaptiveMotionSampler as NumpySampler
    from redisync.terms.torch.sampler import AdaptiveMotionSampler as TorchSampler

    numpy_spec = NumpySampler(100, 0.02, lease_grace_s=3.0).state.schema_entries()["motion/bin_failed"]
    torch_spec = TorchSampler(100, 0.02, lease_grace_s=3.0).schema_entries()["motion/bin_failed"]
    assert numpy_spec.lease_grace_s == torch_spec.lease_grace_s == 3.0
    assert NumpySampler(100, 0.02, lease_grace_s=None).state.schema_entries()["motion/bin_failed"].lease_grace_s is None
