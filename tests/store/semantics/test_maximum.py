"""maximum, the grow-only register: order-free and idempotent on both backends, any shard may raise
it, a lower report lowers nothing, and it lives through the run's life cycle (snapshot and restore,
a store that lost the run re-seeded by the Syncers, pull, inspect and watch)."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redisync
from redisync import errors
from redisync.inspection import describe_run
from redisync.store.client import RunSnapshot
from redisync.store.schema import Schema, maximum, merge

from ...conftest import backend_url, examples, new_store

SCHEMA = Schema.of(
    {"command/range": maximum(3), "terrain/level": maximum(()), "obs/count": merge(1, lifecycle="history")}
)
LEVELS = st.lists(st.sampled_from([-3.0, -0.0, 0.0, 0.5, 1.0, 2.0, 1e300]), min_size=3, max_size=3)


@pytest.mark.parametrize("backend", ["embedded", "real"])
@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    reports=st.lists(st.tuples(st.integers(0, 3), LEVELS), min_size=1, max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_the_fleet_value_is_the_greatest_reported_in_any_order_and_folding_twice_changes_nothing(
    backend, reports, order
):
    """Whatever the order, and however often a report is folded again, the fleet value is the
    element-wise maximum of everything reported."""
    shuffled = list(reports)
    order.shuffle(shuffled)
    finals = []
    for sequence in (reports, shuffled + shuffled[:3]):  # another order, and some reports folded again
        store = new_store(backend)
        try:
            store.register(SCHEMA)
            shards = {i: store.shard(i) for i in range(4)}
            for shard, level in sequence:
                assert shards[shard].publish({"command/range": {"value": level}}).applied
            view = store.fleet().keys["command/range"]
            finals.append((view.value.tobytes(), view.version))
        finally:
            store.delete()
    values = np.array([level for _, level in reports])
    greatest = values.max(axis=0)
    assert np.frombuffer(finals[0][0], "<f8").tolist() == greatest.tolist()
    # the same bits whichever order and however often (-0.0 and +0.0 tie: the first folded stays, so
    # only their sign may differ between orders)
    assert finals[0][0] == finals[1][0] or np.array_equal(
        np.frombuffer(finals[0][0], "<f8"), np.frombuffer(finals[1][0], "<f8")
    )
    # the version counts the reports that raised it: at most one per distinct greater value
    assert 1 <= finals[0][1] <= len(reports)


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_any_shard_raises_it_a_lower_report_lowers_nothing_and_moves_no_version(backend):
    """No owner: any shard may raise the level; a lower report is applied and changes nothing, not
    even the key's version; a non-finite one is refused."""
    store = new_store(backend)
    try:
        store.register(SCHEMA)
        a, b = store.shard(0), store.shard(7)
        first = a.publish({"terrain/level": {"value": 2.0}})
        assert first.applied
        assert first.key_versions == {"terrain/level": 1}
        raised = b.publish({"terrain/level": {"value": 5.0}})  # no owner: any shard may raise it
        assert raised.key_versions == {"terrain/level": 2}
        a.pull()
        lower = a.publish({"terrain/level": {"value": 3.0}})  # applied, and nothing changes
        assert lower.applied
        assert lower.key_versions == {"terrain/level": 2}
        assert lower.fleet_version == raised.fleet_version + 1
        changed = a.pull()  # the fleet version moved; the key did not, so the pull does not carry it
        assert changed is not None
        assert "terrain/level" not in changed.keys
        # a restarted shard starts low again: it lowers nothing
        restarted = store.shard(7)
        assert restarted.publish({"terrain/level": {"value": 0.0}}).key_versions == {"terrain/level": 2}
        view = store.fleet().keys["terrain/level"]
        assert view.value.tolist() == [5.0]
        assert view.version == 2
        assert view.view({}) == {"value": np.array(5.0)}
        assert view.others().tolist() == [5.0]
        with pytest.raises(errors.NonFiniteValue):
            a.publish({"terrain/level": {"value": float("inf")}})
    finally:
        store.delete()


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_snapshot_and_restore_carry_it_and_refuse_a_corrupt_one(backend):
    """A restored run holds the level and folds the next report into it; a snapshot with a field
    the semantics does not write, a non-finite value or a value of another size is refused."""
    src, dst = new_store(backend), new_store(backend)
    try:
        src.register(SCHEMA)
        src.shard(0).publish({"command/range": {"value": [1.0, 4.0, -2.0]}})
        src.shard(1).publish({"command/range": {"value": [3.0, 0.0, -5.0]}})
        snap = RunSnapshot.model_validate_json(src.snapshot().model_dump_json())
        dst.register(SCHEMA)
        dst.restore(snap)
        assert dst.fleet().keys["command/range"].value.tolist() == [3.0, 4.0, -2.0]
        # the next report folds into the restored value
        dst.shard(2).publish({"command/range": {"value": [0.0, 9.0, 0.0]}})
        assert dst.fleet().keys["command/range"].value.tolist() == [3.0, 9.0, 0.0]
        data = "data:command/range"
        for field, raw, why in (
            ("agg", np.zeros(3).tobytes(), "unexpected data field 'agg'"),
            ("value", np.array([1.0, np.nan, 0.0]).tobytes(), "holds a non-finite value"),
            ("value", np.zeros(2).tobytes(), "is 16 bytes, the key needs 24"),
        ):
            import base64

            hashes = {**snap.hashes, data: {**snap.hashes[data], field: base64.b64encode(raw).decode()}}
            with pytest.raises(errors.CorruptSnapshot, match=why):
                dst.restore(snap.model_copy(update={"hashes": hashes}))
    finally:
        src.delete()
        dst.delete()


class Level:
    """A monotone curriculum level of one shard (a command range that only widens): it raises its own
    level as its envs succeed, and adopts the fleet's at the reset boundary."""

    key = "command/level"

    def __init__(self) -> None:
        self.level = 0.0

    def schema_entries(self):
        return {self.key: maximum(())}

    def report_shard_state(self):
        return {self.key: {"value": self.level}}

    def apply_shard_state(self, fleet) -> None:
        view = fleet.keys.get(self.key)
        if view is not None and view.value is not None:
            self.level = max(self.level, float(view.value[0]))


def test_syncers_share_the_greatest_level_and_reseed_a_store_that_lost_the_run():
    """Three Syncers hold the greatest level after a reset boundary, and re-seed a store that lost the
    run with it."""
    url = backend_url("real")
    run = f"max-{uuid.uuid4().hex[:8]}"
    terms = [Level() for _ in range(3)]
    syncers = [
        redisync.new_syncer(redisync.connect(url, run=run), i, [t], publish_every_steps=1, poll_every_s=0.05).start()
        for i, t in enumerate(terms)
    ]
    store = redisync.connect(url, run=run)

    def settle(want: float) -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for s in syncers:
                s.on_step()
                s.flush()
                s.at_reset_boundary()
            if all(t.level == want for t in terms):
                return True
            time.sleep(0.05)
        return False

    try:
        terms[1].level = 4.0  # one shard's envs reached level 4
        terms[2].level = 2.0
        assert settle(4.0), [t.level for t in terms]
        store.delete()  # the store lost the run (a restart without persistence)
        terms[0].level = 5.0
        assert settle(5.0), [t.level for t in terms]
        fleet = store.fleet().keys["command/level"]
        assert fleet.value.tolist() == [5.0]  # re-seeded by the collectors' reports, and raised
    finally:
        for s in syncers:
            s.stop(flush=False)
        store.delete()


def test_inspect_and_watch_show_it(tmp_path):
    """`redisync watch` runs on a run that holds the key, and `redisync inspect` lists it with its semantics."""
    url = backend_url("real")
    store = redisync.connect(url, run=f"max-cli-{uuid.uuid4().hex[:8]}")
    try:
        store.register(SCHEMA)
        store.shard(0).publish({"terrain/level": {"value": 3.0}, "obs/count": {"count": 1, "sum": 1.0}})
        row = next(k for k in describe_run(store)["keys"] if k["key"] == "terrain/level")
        assert row["semantics"] == "maximum"
        assert row["version"] == 1
        assert "slots" not in row
        for command in (
            ["inspect", "--url", url, "--run", store.run],
            ["watch", "--url", url, "--run", store.run, "--count", "1"],
        ):
            out = subprocess.run(
                [sys.executable, "-m", "redisync.cli", *command], capture_output=True, text=True, timeout=120
            )
            assert out.returncode == 0, out.stderr
        inspected = subprocess.run(
            [sys.executable, "-m", "redisync.cli", "inspect", "--url", url, "--run", store.run],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert any(l.split()[:2] == ["terrain/level", "maximum"] for l in inspected.splitlines())
    finally:
        store.delete()


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_a_semantics_the_scripts_do_not_know_is_an_error_everywhere(backend):
    """register.lua refuses the schema, fold.lua the report, pull.lua the read: an unknown kind never
    falls into another semantics' branch."""
    store = new_store(backend)
    try:
        store.register(SCHEMA)
        a = store.shard(0)
        a.publish({"terrain/level": {"value": 1.0}})
        meta = store.keys.key_meta("terrain/level")
        store.redis.hset(meta, "semantics", "median")
        with pytest.raises(errors.CorruptState, match='unknown semantics "median"'):
            a.publish({"terrain/level": {"value": 2.0}})
        with pytest.raises(errors.CorruptState, match='semantics "median" is not one'):
            store.shard(1).pull()
        store.redis.hset(meta, "semantics", "maximum")
        other = new_store(backend)
        try:
            reply = other._call(other.scripts.register, other._key_hashes(SCHEMA), _register_args(SCHEMA, "median"))
            assert [x.decode() if isinstance(x, bytes) else x for x in reply[:2]] == [
                "unknown_semantics",
                "command/range",
            ]
            assert not other.redis.exists(other.keys.meta)  # nothing registered
        finally:
            other.delete()
    finally:
        store.delete()


def _register_args(schema: Schema, semantics: str) -> list:
    """register.lua's arguments for ``schema`` with every key's semantics replaced."""
    args: list = [
        schema.canonical_json(),
        schema.digest,
        "e",
        "1048576|100|0|100|1048576",
        0,
    ]
    for name, spec in schema.keys.items():
        meta = spec.meta_fields(name)
        args += [name, semantics, len(meta), 0, *(x for pair in meta.items() for x in pair)]
    return args
