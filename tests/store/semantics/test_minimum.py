"""minimum, the shrink-only register: order-free and idempotent on both backends, any shard may lower
it, a higher report raises nothing, and it lives through the run's life cycle (snapshot and restore,
a collector's Syncer, inspect). Its Lua against its reference fold: test_contract.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisync import Syncer, SyncSettings, errors
from redisync.inspection import describe_run
from redisync.store.client import RunSnapshot
from redisync.store.schema import Schema, merge
from redisync.store.semantics.minimum import minimum

from ...conftest import examples, new_store
from ...support import wait_for

SCHEMA = Schema.of(
    {"safety/torque_margin": minimum(3), "safety/clearance": minimum(()), "obs/count": merge(1, lifecycle="history")}
)
BOUNDS = st.lists(st.sampled_from([-3.0, -0.0, 0.0, 0.5, 1.0, 2.0, 1e300]), min_size=3, max_size=3)


@pytest.mark.parametrize("backend", ["embedded", "real"])
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reports=st.lists(st.tuples(st.integers(0, 3), BOUNDS), min_size=1, max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_the_fleet_value_is_the_least_reported_in_any_order_and_folding_twice_changes_nothing(backend, reports, order):
    """Whatever the order, and however often a report is folded again, the fleet value is the
    element-wise minimum of everything reported."""
    shuffled = list(reports)
    order.shuffle(shuffled)
    finals = []
    for sequence in (reports, shuffled + shuffled[:3]):
        store = new_store(backend)
        try:
            store.register(SCHEMA)
            shards = {i: store.shard(i) for i in range(4)}
            for shard, bound in sequence:
                assert shards[shard].publish({"safety/torque_margin": {"value": bound}}).applied
            view = store.fleet().keys["safety/torque_margin"]
            finals.append((view.value, view.version))
        finally:
            store.delete()
    least = np.array([bound for _, bound in reports]).min(axis=0)
    assert finals[0][0].tolist() == least.tolist()
    assert np.array_equal(finals[0][0], finals[1][0])  # (-0.0 and +0.0 tie: only their sign may differ)
    assert 1 <= finals[0][1] <= len(reports)  # the version counts the reports that lowered it


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_any_shard_lowers_it_a_higher_report_raises_nothing_and_moves_no_version(backend):
    """No owner: any shard may lower the bound; a higher report is applied and changes nothing, not
    even the key's version; a non-finite one is refused."""
    store = new_store(backend)
    try:
        store.register(SCHEMA)
        a, b = store.shard(0), store.shard(7)
        assert a.publish({"safety/clearance": {"value": 5.0}}).key_versions == {"safety/clearance": 1}
        lowered = b.publish({"safety/clearance": {"value": 2.0}})
        assert lowered.key_versions == {"safety/clearance": 2}
        a.pull()
        higher = a.publish({"safety/clearance": {"value": 3.0}})
        assert higher.applied
        assert higher.key_versions == {"safety/clearance": 2}
        changed = a.pull()  # the fleet version moved; the key did not, so the pull does not carry it
        assert changed is not None
        assert "safety/clearance" not in changed.keys
        restarted = store.shard(7)  # a restarted shard starts high again: it raises nothing
        assert restarted.publish({"safety/clearance": {"value": 9.0}}).key_versions == {"safety/clearance": 2}
        view = store.fleet().keys["safety/clearance"]
        assert view.value.tolist() == [2.0]
        assert view.view({}) == {"value": np.array(2.0)}
        with pytest.raises(errors.NonFiniteValue):
            a.publish({"safety/clearance": {"value": float("-inf")}})
    finally:
        store.delete()


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_snapshot_and_restore_carry_it_and_refuse_a_corrupt_one(backend):
    """A restored run holds the bound and folds the next report into it; a snapshot whose value is
    not finite or not of the key's size is refused."""
    src, dst = new_store(backend), new_store(backend)
    try:
        src.register(SCHEMA)
        src.shard(0).publish({"safety/torque_margin": {"value": [1.0, 4.0, -2.0]}})
        src.shard(1).publish({"safety/torque_margin": {"value": [3.0, 0.0, -5.0]}})
        snap = RunSnapshot.model_validate_json(src.snapshot().model_dump_json())
        dst.register(SCHEMA)
        dst.restore(snap)
        assert dst.fleet().keys["safety/torque_margin"].value.tolist() == [1.0, 0.0, -5.0]
        dst.shard(2).publish({"safety/torque_margin": {"value": [0.0, 9.0, 0.0]}})
        assert dst.fleet().keys["safety/torque_margin"].value.tolist() == [0.0, 0.0, -5.0]
        data = "data:safety/torque_margin"
        for raw, why in (
            (np.array([1.0, np.nan, 0.0]).tobytes(), "holds a non-finite value"),
            (np.zeros(2).tobytes(), "is 16 bytes, the key needs 24"),
        ):
            hashes = {**snap.hashes, data: {**snap.hashes[data], "value": base64.b64encode(raw).decode()}}
            with pytest.raises(errors.CorruptSnapshot, match=why):
                dst.restore(snap.model_copy(update={"hashes": hashes}))
    finally:
        src.delete()
        dst.delete()


class Clearance:
    """A shard's safety margin: it lowers its own bound where its envs came close, and adopts the
    fleet's (the tightest any shard has seen) at the reset boundary."""

    key = "safety/clearance"

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def schema_entries(self):
        return {self.key: minimum(())}

    def report_shard_state(self):
        return {self.key: {"value": self.bound}}

    def apply_shard_state(self, fleet) -> None:
        view = fleet.keys.get(self.key)
        if view is not None and view.value is not None:
            self.bound = min(self.bound, float(view.value[0]))


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_collectors_adopt_the_tightest_bound_any_shard_has_seen_and_inspect_shows_it(backend):
    """Two Syncers, each with its own bound: both hold the lower one after a reset boundary, and the
    inspector lists the key with its semantics."""
    store = new_store(backend)
    terms = [Clearance(0.3), Clearance(0.1)]
    syncers = [
        Syncer(store, i, [t], settings=SyncSettings(publish_every_steps=1, poll_every_s=0.05)).start()
        for i, t in enumerate(terms)
    ]

    def settled() -> bool:
        for syncer in syncers:
            syncer.on_step()
            syncer.flush()
            syncer.at_reset_boundary()
        return all(t.bound == 0.1 for t in terms)

    try:
        assert wait_for(settled, timeout=30), [t.bound for t in terms]
        row = next(k for k in describe_run(store)["keys"] if k["key"] == "safety/clearance")
        assert row["semantics"] == "minimum"
        assert row["version"] >= 1
    finally:
        for syncer in syncers:
            syncer.stop(flush=False)
        store.delete()
