"""What an operator asks of a store (`redisync.inspection`), each answer against what the shards
published: the runs, a run's slots and their ages, and how far each shard is from the pooled value."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

import redisync
from redisync import inspection
from redisync.store.schema import Schema, merge

EMA, NORM = "motion/bin_failed", "obs/norm"


def _run(url: str, run: str | None = None):
    store = redisync.connect(url, run=run or f"t-insp-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({EMA: merge(4, lifecycle="state"), NORM: merge(2, sumsq=True, lifecycle="history")}))
    return store


def _entropy(p):
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(p.size))


def test_a_distribution_keys_drift_is_each_shards_distance_from_the_pooled_one(counted_url):
    """Two shards with failures in opposite halves: each own distribution is 0.5 (TV) from the pooled
    one, with the entropies of the normalised sums; the parts add up to the aggregate."""
    store = _run(counted_url)
    try:
        sums = {0: np.array([3.0, 1.0, 0.0, 0.0]), 1: np.array([0.0, 0.0, 1.0, 3.0])}
        for shard, s in sums.items():
            store.shard(shard).publish({EMA: {"count": 1.0, "sum": s}})
        agg, slots = inspection.slot_parts(store, EMA)
        np.testing.assert_allclose(agg["sum"], sums[0] + sums[1])
        assert sorted(slots) == [0, 1]
        np.testing.assert_allclose(slots[1]["sum"], sums[1])
        row = inspection.drift(store)[EMA]
        assert row["kind"] == "distribution"
        pooled = (sums[0] + sums[1]) / 8
        assert row["pooled_entropy"] == pytest.approx(_entropy(pooled))
        for shard, s in sums.items():
            own = s / s.sum()
            assert row["shards"][shard]["tv"] == pytest.approx(0.5 * np.abs(own - pooled).sum())
            assert row["shards"][shard]["tv"] == pytest.approx(0.5)
            assert row["shards"][shard]["entropy"] == pytest.approx(_entropy(own))
    finally:
        store.delete()


def test_a_moments_keys_drift_is_each_shards_mean_offset_in_pooled_standard_deviations(counted_url):
    """Normaliser statistics: a shard's largest mean offset from the pooled mean, in pooled sds."""
    store = _run(counted_url)
    try:
        samples = {0: np.array([[0.0, 1.0], [2.0, 1.0]]), 1: np.array([[4.0, 1.0], [6.0, 1.0]])}
        for shard, x in samples.items():
            store.shard(shard).publish({NORM: {"count": float(len(x)), "sum": x.sum(0), "sumsq": (x * x).sum(0)}})
        every = np.concatenate(list(samples.values()))
        mean, sd = every.mean(0), np.maximum(every.std(0), 1e-12)
        row = inspection.drift(store)[NORM]
        assert row["kind"] == "moments"
        for shard, x in samples.items():
            assert row["shards"][shard]["offset_sd"] == pytest.approx(np.max(np.abs(x.mean(0) - mean) / sd))
    finally:
        store.delete()


def test_a_runs_description_names_its_keys_slots_and_shards_and_every_run_is_listed(counted_url):
    """describe_run: the keys with their versions, the shards that reported (ages from the server's
    clock) and the fleet version; describe_runs lists every run on the server and skips, saying why,
    a key that only looks like a run's meta."""
    store, other = _run(counted_url), _run(counted_url)
    foreign = "redisync:{not-a-run}:meta"
    raw = store.server().client
    try:
        store.shard(0).publish({EMA: {"count": 1.0, "sum": np.ones(4)}})
        store.shard(1).publish({EMA: {"count": 1.0, "sum": np.ones(4)}})
        store.shard(0).publish({EMA: {"count": 1.0, "sum": np.ones(4)}})
        described = inspection.describe_run(store)
        assert described["run"] == store.run
        assert described["fleet_version"] == 3
        assert {k["key"]: k["version"] for k in described["keys"]} == {EMA: 3, NORM: 0}
        assert sorted(described["shards"]) == [0, 1]
        assert all(0 <= age < 600 for age in described["shards"].values())
        reports = inspection.shard_reports(store)
        assert reports[1]["seen"] is not None
        assert reports[0]["behind"] >= 0
        raw.set(foreign, "x")
        runs, skipped = inspection.describe_runs(store, lambda name: redisync.connect(counted_url, run=name))
        assert {store.run, other.run} <= {r["run"] for r in runs}
        assert [key for key, _ in skipped] == [foreign]
    finally:
        raw.delete(foreign)
        store.delete()
        other.delete()
