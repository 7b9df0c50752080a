"""A merge key: the exact sum of every shard's live slot, own substitution, its two-level sums and its life cycles."""

from __future__ import annotations

import numpy as np
import pytest

from redisync import errors
from redisync.store import codec
from redisync.store.schema import merge

from ..test_life_cycle import scalar
from ..test_store import SCHEMA, assert_matches_reference, ema


def test_merge_needs_its_lifecycle_and_says_what_each_is_for():
    """merge() without a lifecycle is refused, saying what state and history are for."""
    with pytest.raises(
        errors.InvalidSchema, match=r"lifecycle=.state. \(a current value.*lifecycle='history' \(counts"
    ):
        merge(4)


def test_publish_then_pull_gives_the_pooled_state_and_own_slot(make_store):
    """A publish returns the new fleet and key versions; a pull returns the pooled state with the caller's own
    slot as folded, and then only what changed since."""
    store = make_store()
    store.register(SCHEMA)
    a, b = store.shard(0), store.shard(1)
    r1 = a.publish({"motion/bin_failed": ema(0), "curriculum/scale": {"value": 0.7}})
    r2 = b.publish({"motion/bin_failed": ema(1)})
    assert r1.applied
    assert r1.fleet_version == 1
    assert r1.key_versions == {"motion/bin_failed": 1, "curriculum/scale": 1}
    assert r2.fleet_version == 2
    assert r2.key_versions == {"motion/bin_failed": 2}

    got = a.pull()
    assert got is not None
    assert got.fleet_version == 2
    assert got.epoch_changed
    key = got.keys["motion/bin_failed"]
    assert key.version == 2
    np.testing.assert_array_equal(key.parts()["sum"], np.arange(4.0) * 2 + 1)
    assert key.parts()["count"] == 2
    np.testing.assert_array_equal(key.own_slot, np.r_[1.0, np.arange(4.0)])
    assert key.own_incarnation == a.incarnation
    assert float(got.keys["curriculum/scale"].parts()["value"]) == 0.7
    # own substitution: the others' data as pulled plus our own state of now
    view = key.view({"count": 3, "sum": 5 * np.arange(4.0)})
    assert view["count"] == 1 + 3
    np.testing.assert_array_equal(view["sum"], np.arange(4.0) + 1 + 5 * np.arange(4.0))
    with pytest.raises(errors.ShapeMismatch):
        key.view({"count": 1, "sum": np.ones(5)})

    assert a.pull() is None  # nothing changed: nothing returned
    b.publish({"curriculum/stage": {"value": [3.0]}})
    changed = a.pull()
    assert set(changed.keys) == {"curriculum/stage"}
    assert changed.fleet_version == 3
    assert set(a.known.keys) == set(SCHEMA.keys)  # the client keeps the whole state


def test_a_run_folded_before_two_level_sums_has_them_remade_at_its_next_fold(make_store):
    """A run whose sums an older redisync laid out as one level (group = its slots' sum, no
    sums_layout) is not trusted: the next fold re-makes every sub-group and group sum from the
    slots, so the state is the reference's bit for bit, and a snapshot of the older layout restores
    with its sums re-made (they are derived data), whatever they held."""
    from redisync.store.semantics import merge as semantics

    store = make_store()
    store.register(SCHEMA)
    values = {shard: [3.0, 0.1 * shard, 0.3, 0.7 * shard, 0.2] for shard in (0, 1, 5, 6, 9, 17)}
    clients = {shard: store.shard(shard) for shard in values}
    for shard, v in values.items():
        clients[shard].publish({"obs/norm": {"count": v[0], "sum": v[1:3], "sumsq": v[3:]}})
    meta, data = store.keys.key_meta("obs/norm"), store.keys.key_data("obs/norm")

    def as_one_level() -> None:
        store.redis.hdel(meta, "sums_layout")
        store.redis.hdel(data, *[f for f in store.redis.hkeys(data) if f.startswith((b"sub:", b"group:", b"counts:"))])
        for g, ids in {0: (0, 1, 5, 6, 9), 1: (17,)}.items():
            flat = semantics.summed([np.array(values[i]) for i in ids], 5)
            store.redis.hset(data, f"group:{g}", codec.encode([flat]))

    as_one_level()
    values[17] = [4.0, 1.0, 1.0, 1.0, 1.0]
    clients[17].publish({"obs/norm": {"count": 4.0, "sum": [1.0, 1.0], "sumsq": [1.0, 1.0]}})
    assert_matches_reference(store, values)

    as_one_level()
    snap = store.snapshot()
    hashes = dict(snap.hashes)
    garbage = codec.encode([np.full(5, 7.0)])
    import base64

    hashes["data:obs/norm"] = {**hashes["data:obs/norm"], "agg": base64.b64encode(garbage).decode()}
    store.restore(snap.model_copy(update={"hashes": hashes}))
    assert_matches_reference(store, values)


@pytest.mark.parametrize(("field", "parts"), [("sub:0", "slots"), ("group:0", "sub-groups")])
def test_a_fold_refuses_a_stored_sum_it_can_prove_wrong(make_store, field, parts):
    """A fold that re-makes a sub-group or group sum checks that the stored one was its parts' sum,
    on its count record (``counts:<field>``, count_size values, so the fold reads no whole vector for
    it): a damaged one is refused, and nothing is written."""
    store = make_store()
    store.register(SCHEMA)
    shards = {shard: store.shard(shard) for shard in (0, 1, 2, 5, 17)}  # (17: group 0 is not the only group)
    for client in shards.values():
        client.publish({"obs/norm": {"count": 3, "sum": [1, 2], "sumsq": [1, 4]}})
    data = store.keys.key_data("obs/norm")
    damaged = codec.decode(store.redis.hget(data, f"counts:{field}"))
    damaged[0] += 1000.0
    store.redis.hset(data, f"counts:{field}", codec.encode([damaged]))
    before = store.fleet()
    with pytest.raises(errors.CorruptState, match=f"{field} disagrees with the sum of its {parts}"):
        shards[1].publish({"obs/norm": {"count": 4, "sum": [1, 2], "sumsq": [1, 4]}})
    after = store.fleet()
    assert after.fleet_version == before.fleet_version
    np.testing.assert_array_equal(after.keys["obs/norm"].value, before.keys["obs/norm"].value)
    assert store.dead_letters()[0]["reason"] == "corrupt_state"


def test_the_aggregate_is_exact_after_a_huge_value_left_the_slot(make_store):
    """The aggregate is the sum of the live slots, re-made, not updated incrementally: a huge value that left
    a slot leaves no rounding behind."""
    store = make_store()
    store.register({"motion/ema": merge(1, lifecycle="history")})
    a, b = store.shard(0), store.shard(1)
    for shard, v in ((a, 1e16), (b, 1.0), (a, 0.0), (b, 0.5)):  # an incremental (agg - old) + new ends at -0.5
        shard.publish({"motion/ema": {"count": 1, "sum": v}})
    assert scalar(store.fleet().keys["motion/ema"].parts()["sum"]) == 0.5
