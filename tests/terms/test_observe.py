"""The ``observe`` mode: an unsynced run that measures its own drift. Each shard samples exactly as
``local`` does, reports and reads as ``pooled`` does, and its metrics give the distance the studies'
records define (the TV distance of the shard's start distribution from the pooled one - the sum of
every shard's own EMA, under the same uniform mix - at the same moment); where that distance is as
large as where unsynced shards trained worse, it warns once."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from redisync.terms import formulas
from redisync.terms import numpy as rnp
from redisync.terms import torch as rt
from redisync.terms.role import Role
from redisync.terms.torch.sampler import sampling_probabilities

from ..support import sync

FRAMES, STEP_DT, ENVS = 600, 0.02, 48  # 13 bins per motion


def _records_definition(emas: list[np.ndarray], used: np.ndarray, uniform_ratio: float) -> float:
    """The studies' drift (`redisync.study.fleet.fleet_drift`, which builds the pooled distribution
    with this function): the distribution a shard samples from
    against the pooled EMA's, under the same mix."""
    pooled = sampling_probabilities(
        torch.as_tensor(np.sum(emas, axis=0), dtype=torch.float64),
        uniform_ratio,
        torch.ones(1, dtype=torch.float64),
        "code",
    ).numpy()
    return 0.5 * float(np.abs(used - pooled).sum())


def _fleet(kind: str, mode: str, shards: int, alpha: float):
    if kind == "numpy":
        return [
            rnp.AdaptiveMotionSampler(FRAMES, STEP_DT, mode=mode, shard_id=i, alpha=alpha, dtype=np.float64)
            for i in range(shards)
        ]
    return [
        rt.AdaptiveMotionSampler(FRAMES, STEP_DT, mode=mode, shard_id=i, alpha=alpha, dtype=torch.float64)
        for i in range(shards)
    ]


def _own(sampler) -> np.ndarray:
    ema = sampler.ema if isinstance(sampler, rnp.AdaptiveMotionSampler) else sampler.bin_failed_count
    return np.asarray(ema, dtype=np.float64).copy()


def _used(sampler) -> np.ndarray:
    probs = sampler.probabilities()
    return np.asarray(probs.numpy() if isinstance(probs, torch.Tensor) else probs, dtype=np.float64)


def _step(sampler, ts: np.ndarray, failed: np.ndarray) -> None:
    if isinstance(sampler, rnp.AdaptiveMotionSampler):
        sampler.record_failures(ts, failed)
    else:
        sampler.record_failures(torch.as_tensor(ts), torch.as_tensor(failed))
    sampler.step()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_observing_fleet_samples_as_local_and_measures_the_records_drift(make_store, kind):
    """Four observing shards fed what four local ones are: the same distributions, bit for bit (the
    unsynced algorithm), while each shard's ``drift_tv`` is the records' distance at that moment."""
    shards, alpha = 4, 0.05
    observing, local = _fleet(kind, "observe", shards, alpha), _fleet(kind, "local", shards, alpha)
    assert observing[0].options.role is Role.OBSERVES
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(shards)]
    rng = np.random.default_rng(7)
    checked = 0
    for step in range(1, 121):
        for i in range(shards):
            ts = rng.integers(0, FRAMES, ENVS)
            failed = rng.random(ENVS) < 0.01 + 0.2 * (ts > 400) * (i + 1) / shards  # shards see different failures
            _step(observing[i], ts, failed)
            _step(local[i], ts, failed)
        if step % 10 == 0:
            sync(store, clients, [[s] for s in observing])
            emas = [_own(s) for s in observing]
            for obs, loc in zip(observing, local, strict=True):
                np.testing.assert_array_equal(_used(obs), _used(loc))
                metrics = obs.metrics()
                expected = _records_definition(emas, _used(obs), obs.uniform_ratio)
                assert metrics["drift_tv"] == pytest.approx(expected, abs=1e-12)
                checked += 1
    assert checked == 12 * shards
    assert max(s.metrics()["drift_tv"] for s in observing) > 0.05  # (the shards did drift apart)
    assert all(s.metrics()["drift_measurements"] > 0 for s in observing)


def redisync_schema(sampler):
    from redisync.store.schema import Schema

    return Schema.of(dict(sampler.schema_entries()))


def _drifting_fleet(kind: str, mode: str, make_store, shards: int = 8):
    """Shards that see few failures each (the walker's regime): their own distributions are far from
    the pooled one. Returns the warnings each shard raised and its last metrics."""
    fleet = _fleet(kind, mode, shards, alpha=0.02)
    store = make_store()
    store.register(redisync_schema(fleet[0]))
    clients = [store.shard(i) for i in range(shards)]
    rng = np.random.default_rng(3)
    caught: list[list[str]] = [[] for _ in range(shards)]
    last = [{} for _ in range(shards)]
    for step in range(1, 301):
        for i, sampler in enumerate(fleet):
            ts = rng.integers(0, FRAMES, 4)
            _step(sampler, ts, rng.random(4) < 0.05 * (ts // 200 == i % 3))
        if step % 10 == 0:
            sync(store, clients, [[s] for s in fleet])
            for i, sampler in enumerate(fleet):
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    last[i] = sampler.metrics()
                caught[i] += [str(w.message) for w in seen if issubclass(w.category, formulas.DriftWarning)]
    return caught, last


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_observing_shard_warns_once_where_its_measured_drift_is_large_and_a_pooled_one_never(make_store, kind):
    """The rule (`formulas.drift_warning`) on the shard's own measurements: once, with the numbers,
    where the mean drift reaches the threshold; a pooled shard (which samples from the pool) never."""
    caught, last = _drifting_fleet(kind, "observe", make_store)
    assert max(m["drift_tv_mean"] for m in last) >= formulas.DRIFT_WARNING_TV
    assert all(len(c) == 1 for c in caught)
    assert "mode='pooled'" in caught[0][0]
    assert f"at least the {formulas.DRIFT_WARNING_TV:.2f}" in caught[0][0]
    pooled_caught, pooled_last = _drifting_fleet(kind, "pooled", make_store)
    assert not any(pooled_caught)
    assert all("drift_tv_mean" not in m for m in pooled_last)


def test_the_rule_needs_its_measurements_and_its_threshold():
    """Too few measurements, or a mean below the threshold: nothing said."""
    assert formulas.drift_warning(0.9, formulas.DRIFT_WARNING_MEASUREMENTS - 1, "x") is None
    assert formulas.drift_warning(formulas.DRIFT_WARNING_TV - 1e-9, 10, "x") is None
    assert formulas.drift_warning(float("nan"), 10, "x") is None
    assert formulas.drift_warning(formulas.DRIFT_WARNING_TV, formulas.DRIFT_WARNING_MEASUREMENTS, "x") is not None


def test_an_observing_numpy_normaliser_normalises_with_its_own_statistics_and_measures_the_offset(make_store):
    """Two shards that see inputs of different means: observing, each normalises exactly as a local
    one does, while it reports and reads as pooled does; ``drift_offset_sd`` is its own mean's offset
    from the fleet's, in the fleet's standard deviations, computed here from the samples themselves."""
    rng = np.random.default_rng(5)
    observing = [rnp.EmpiricalNormalizer(2, mode="observe", dtype=np.float64) for _ in range(2)]
    local = [rnp.EmpiricalNormalizer(2, mode="local", dtype=np.float64) for _ in range(2)]
    assert observing[0].role is Role.OBSERVES
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(2)]
    seen: list[list[np.ndarray]] = [[], []]
    for _ in range(5):
        for i in range(2):
            x = rng.normal(loc=3.0 * i, size=(64, 2))
            seen[i].append(x)
            observing[i].update(x)
            local[i].update(x)
        sync(store, clients, [[n] for n in observing])
    everything = np.concatenate(seen[0] + seen[1])
    for i in range(2):
        np.testing.assert_array_equal(observing[i].mean, local[i].mean)
        np.testing.assert_array_equal(observing[i].std, local[i].std)
        own = np.concatenate(seen[i]).mean(axis=0)
        expected = np.max(np.abs(own - everything.mean(axis=0)) / everything.std(axis=0))
        assert observing[i].metrics()["drift_offset_sd"] == pytest.approx(expected, rel=1e-9)
    assert local[0].metrics() == {}


def test_an_observing_torch_normaliser_normalises_as_rsl_rls_and_measures_the_offset(make_store):
    """The torch normaliser (rsl_rl's buffers) in ``observe``: its buffers are rsl_rl's own running
    update's, bit for bit, as a ``local`` one's; it reports and reads as a pooled one does, and
    ``drift_offset_sd`` is its own mean's offset from the fleet's, from the samples themselves."""
    torch.manual_seed(5)
    observing = [rt.SyncedEmpiricalNormalization(2, mode="observe") for _ in range(2)]
    local = [rt.SyncedEmpiricalNormalization(2, mode="local") for _ in range(2)]
    assert observing[0].role is Role.OBSERVES
    assert observing[0].metrics() == {}  # (no fleet state yet)
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(2)]
    seen: list[list[torch.Tensor]] = [[], []]
    for _ in range(5):
        for i in range(2):
            x = torch.randn(64, 2) + 3.0 * i
            seen[i].append(x)
            observing[i].update(x)
            local[i].update(x)
        sync(store, clients, [[n] for n in observing])
    everything = torch.cat(seen[0] + seen[1]).double()
    for i in range(2):
        for name in ("_mean", "_var", "_std", "count"):
            assert torch.equal(observing[i].state_dict()[name], local[i].state_dict()[name]), name
        own = torch.cat(seen[i]).double().mean(0)
        expected = float(((own - everything.mean(0)).abs() / everything.std(0, unbiased=False)).max())
        assert observing[i].metrics()["drift_offset_sd"] == pytest.approx(expected, rel=1e-9)
    assert local[0].metrics() == {}


@pytest.mark.integration  # two collectors, each with its sidecar process
def test_observing_through_the_sidecar_measures_the_fleet_and_samples_its_own(real_url):
    """With the process worker the fleet part arrives through shared memory (not `apply_shard_state`):
    an observing torch sampler still samples from its own EMA, and still measures against the fleet."""
    import uuid

    import redisync
    from redisync.collector.workers import new_syncer

    run = f"observe-sidecar-{uuid.uuid4().hex[:8]}"
    samplers = [rt.AdaptiveMotionSampler(FRAMES, STEP_DT, mode="observe", shard_id=i, alpha=0.05) for i in range(2)]
    syncers = [
        new_syncer(redisync.connect(real_url, run=run), i, [s], worker="process").start()
        for i, s in enumerate(samplers)
    ]
    rng = np.random.default_rng(0)
    try:
        for _ in range(200):
            for i, (sampler, syncer) in enumerate(zip(samplers, syncers, strict=True)):
                ts = rng.integers(0, FRAMES, 16)
                _step(sampler, ts, rng.random(16) < 0.05 * (ts // 200 == i))
                syncer.on_step()
                syncer.at_reset_boundary()
        for syncer in syncers:
            assert syncer.wait_synced(at_least=1, timeout=30)
            syncer.at_reset_boundary()
        for sampler, syncer in zip(samplers, syncers, strict=True):
            assert sampler.fleet_version > 0
            own = sampler._distributions(sampler.bin_failed_count)
            assert torch.equal(own, sampler.probabilities().view(1, -1))  # it samples its own
            assert syncer.metrics()["redisync/motion/bin_failed/drift_tv"] > 0.05  # and measures the fleet
    finally:
        for syncer in syncers:
            syncer.stop()
        redisync.connect(real_url, run=run).delete()


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_an_observing_runs_drift_is_in_watch_and_the_exporter_as_its_samplers_measure_it(real_url, kind):
    """Each observing shard reports the drift it measures (``<key>.drift_tv``): after a round, the
    store holds for every shard what its ``metrics()`` gave just before it reported - the sampler's
    formulas, mix included, not the raw slots' distance - and `redisync watch` and the exporter show
    it per shard. Local and pooled shards report no such key."""
    pytest.importorskip("prometheus_client")
    from rich.console import Console

    import redisync
    from redisync.cli.watch import WatchState, frame
    from redisync.exporter import FleetCollector
    from redisync.inspection import drift, measured_drift

    shards, alpha = 4, 0.05
    observing = _fleet(kind, "observe", shards, alpha)
    key = "motion/bin_failed"  # (the samplers' default key)
    assert set(_fleet(kind, "pooled", 1, alpha)[0].schema_entries()) == {key}
    assert set(observing[0].schema_entries()) == {key, key + ".drift_tv"}
    store = redisync.connect(real_url, run=f"t-observe-{kind}-{np.random.default_rng().integers(1 << 40):x}")
    try:
        store.register(redisync_schema(observing[0]))
        clients = [store.shard(i) for i in range(shards)]
        rng = np.random.default_rng(11)
        before: list[float] = []
        for step in range(1, 61):
            for i in range(shards):
                ts = rng.integers(0, FRAMES, ENVS)
                _step(observing[i], ts, rng.random(ENVS) < 0.01 + 0.2 * (ts > 400) * (i + 1) / shards)
            if step % 10 == 0:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", formulas.DriftWarning)  # (these shards do drift)
                    before = [s.metrics()["drift_tv"] for s in observing]
                sync(store, clients, [[s] for s in observing])
        measured = measured_drift(store)[key]
        assert measured == pytest.approx(dict(enumerate(before)), abs=1e-12)
        assert max(measured.values()) > 0.05
        raw = {s: d["tv"] for s, d in drift(store)[key]["shards"].items()}
        assert raw != pytest.approx(measured, abs=1e-3)  # (the store's slots alone give another distance)
        gauges = {
            (int(s.labels["shard"]), s.labels["key"]): s.value
            for family in FleetCollector(real_url, runs=(store.run,)).collect()
            for s in family.samples
            if s.name == "redisync_shard_measured_tv"
        }
        assert gauges == pytest.approx({(i, key): v for i, v in measured.items()}, abs=1e-12)
        console = Console(width=400, record=True)
        console.print(frame(store, real_url, WatchState()))
        text = console.export_text()
        assert f"{key} TV measured" in text
        for v in measured.values():
            assert f"{v:.4f}" in text
    finally:
        store.delete()


def test_an_observing_episode_length_tracker_decides_from_its_own_and_measures_the_fleets(make_store):
    """holosoma's episode-length tracker in ``observe``: the average it decides from is a local
    tracker's, bit for bit; it reports and reads as a pooled one does, and its metrics give the
    fleet's weighted mean (episodes behind each shard's average, capped at the window) and its own
    average's distance from it."""
    observing = [rt.AverageEpisodeLength(num_envs=64, mode="observe", shard_id=i) for i in range(2)]
    local = [rt.AverageEpisodeLength(num_envs=64, mode="local", shard_id=i) for i in range(2)]
    assert observing[0].metrics() == {}
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(2)]
    torch.manual_seed(2)
    for _ in range(4):
        for i in range(2):
            lengths = torch.randint(50 + 200 * i, 100 + 200 * i, (3 + 5 * i,))
            observing[i].update(lengths)
            local[i].update(lengths)
        sync(store, clients, [[t] for t in observing])
    weights = [float(min(t.episodes, t.window)) for t in local]
    fleet = sum(w * t.own_average for w, t in zip(weights, local, strict=True)) / sum(weights)
    for i in range(2):
        assert observing[i].value == local[i].value == local[i].own_average
        metrics = observing[i].metrics()
        assert metrics["fleet_episode_length"] == pytest.approx(fleet, rel=1e-12)
        assert metrics["drift_episode_length"] == pytest.approx(local[i].own_average - fleet, rel=1e-9)
    assert abs(observing[0].metrics()["drift_episode_length"]) > 50  # (the shards' averages differ)
    assert local[0].metrics() == {}


def test_an_observing_penalty_curriculum_decides_its_own_scale_and_measures_the_fleets_mean(make_store):
    """holosoma's penalty curriculum in ``observe``: each shard moves its own scale as a local one does,
    reports it, and its metrics give the fleet's mean scale and its own distance from it."""
    kwargs = {"initial_scale": 0.5, "degree": 0.1}
    observing = [rt.PenaltyCurriculum(**kwargs, mode="observe", shard_id=i) for i in range(3)]
    local = [rt.PenaltyCurriculum(**kwargs, mode="local", shard_id=i) for i in range(3)]
    assert observing[0].metrics() == {}
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(3)]
    for _ in range(5):
        for i, length in enumerate((100.0, 500.0, 900.0)):  # down, still, up
            assert observing[i].update(length) == local[i].update(length)
        sync(store, clients, [[t] for t in observing])
    fleet = sum(t.scale for t in local) / 3
    for i in range(3):
        assert observing[i].scale == local[i].scale
        metrics = observing[i].metrics()
        assert metrics["fleet_penalty_scale"] == pytest.approx(fleet, rel=1e-12)
        assert metrics["drift_penalty_scale"] == pytest.approx(local[i].scale - fleet, rel=1e-9, abs=1e-15)
    assert observing[0].scale < observing[1].scale < observing[2].scale


def test_observing_terrain_levels_move_as_local_ones_and_measure_the_fleets_levels(make_store):
    """IsaacLab's terrain levels in ``observe``: each shard's envs move exactly as a local shard's, the
    mean level it logs is its own; it reports its histogram as a pooled one does, and its metrics give
    the fleet's mean level and its own distance from it, in mean level and in total variation."""
    observing = [rt.TerrainLevels(40, 6, mode="observe", generator=torch.Generator().manual_seed(i)) for i in range(3)]
    local = [rt.TerrainLevels(40, 6, mode="local", generator=torch.Generator().manual_seed(i)) for i in range(3)]
    assert observing[0].metrics() == {}
    store = make_store()
    store.register(redisync_schema(observing[0]))
    clients = [store.shard(i) for i in range(3)]
    moves = torch.Generator().manual_seed(9)
    for _ in range(6):
        for i in range(3):
            env_ids = torch.randperm(40, generator=moves)[:20]
            up = torch.rand(20, generator=moves) < 0.2 * (i + 1)  # shard 2 climbs fastest
            down = torch.rand(20, generator=moves) < 0.3
            observing[i].update(env_ids, up, down)
            local[i].update(env_ids, up, down)
        sync(store, clients, [[t] for t in observing])
    fleet = sum(t.histogram() for t in local)
    fleet_mean = float((fleet * np.arange(6)).sum() / fleet.sum())
    for i in range(3):
        assert torch.equal(observing[i].levels, local[i].levels)
        assert observing[i].mean_level() == local[i].mean_level()
        own = local[i].histogram()
        metrics = observing[i].metrics()
        assert metrics["fleet_mean_level"] == pytest.approx(fleet_mean, rel=1e-12)
        assert metrics["drift_mean_level"] == pytest.approx(local[i].mean_level() - fleet_mean, rel=1e-9, abs=1e-12)
        tv = 0.5 * np.abs(own / own.sum() - fleet / fleet.sum()).sum()
        assert metrics["drift_levels_tv"] == pytest.approx(tv, rel=1e-12)
    assert observing[2].metrics()["drift_mean_level"] > observing[0].metrics()["drift_mean_level"]
    assert local[0].metrics() == {}
