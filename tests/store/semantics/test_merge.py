"""A merge key: the exact sum of every shard's live slot, own substitution, its two-level sums and its life cycles."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_a_run_folded_by_an_earlier_layout_has_its_exact_sum_remade_at_its_next_fold(make_store):
    """A run whose sums an older redisync laid out as sub-group and group sums (sums_layout
    ``4/16/lone``, no ``agg_lo``) is not trusted: the next fold re-makes the exact sum from the slots
    (and drops the earlier layout's fields), so the state is the reference's bit for bit; a snapshot
    of the older layout restores with its sum re-made (it is derived data), whatever it held."""
    store = make_store()
    store.register(SCHEMA)
    values = {shard: [3.0, 0.1 * shard, 0.3, 0.7 * shard, 0.2] for shard in (0, 1, 5, 6, 9, 17)}
    clients = {shard: store.shard(shard) for shard in values}
    for shard, v in values.items():
        clients[shard].publish({"obs/norm": {"count": v[0], "sum": v[1:3], "sumsq": v[3:]}})
    meta, data = store.keys.key_meta("obs/norm"), store.keys.key_data("obs/norm")

    def as_earlier_layout() -> None:
        store.redis.hset(meta, "sums_layout", "4/16/lone")
        store.redis.hdel(data, "agg_lo")
        garbage = codec.encode([np.full(5, 7.0)])
        store.redis.hset(data, mapping={"agg": garbage, "sub:0": garbage, "counts:sub:0": garbage[:8],
                                        "group:1": garbage, "counts:slot:17": garbage[:8]})  # fmt: skip

    as_earlier_layout()
    values[17] = [4.0, 1.0, 1.0, 1.0, 1.0]
    clients[17].publish({"obs/norm": {"count": 4.0, "sum": [1.0, 1.0], "sumsq": [1.0, 1.0]}})
    assert_matches_reference(store, values)  # (lua_state: no field of the earlier layout is left)

    as_earlier_layout()
    snap = store.snapshot()
    store.restore(snap)
    assert_matches_reference(store, values)


@pytest.mark.parametrize("damage", ["agg_lo of the wrong length", "agg_lo missing", "planes not canonical"])
def test_a_fold_refuses_a_stored_exact_sum_that_is_damaged(make_store, damage):
    """A fold adds to the stored exact sum, so it checks what it can see of it: ``agg_lo`` a whole
    number of rows, present, and each element's planes canonical (the first plane the rounded sum
    of the planes); a damaged one is refused, and nothing is written."""
    store = make_store()
    store.register(SCHEMA)
    shards = {shard: store.shard(shard) for shard in (0, 1, 2, 5, 17)}
    for client in shards.values():
        client.publish({"obs/norm": {"count": 3, "sum": [1, 2], "sumsq": [1, 4]}})
    data = store.keys.key_data("obs/norm")
    if damage == "agg_lo of the wrong length":
        store.redis.hset(data, "agg_lo", b"\0" * 12)
    elif damage == "agg_lo missing":
        store.redis.hdel(data, "agg_lo")
    else:
        store.redis.hset(data, "agg_lo", codec.encode([np.full(5, 1.0)]))  # (the sum's first plane is 15)
    before = store.fleet()
    with pytest.raises(errors.CorruptState, match=r"agg_lo|planes"):
        shards[1].publish({"obs/norm": {"count": 4, "sum": [1, 2], "sumsq": [1, 4]}})
    after = store.fleet()
    assert after.fleet_version == before.fleet_version
    np.testing.assert_array_equal(after.keys["obs/norm"].value, before.keys["obs/norm"].value)
    assert store.dead_letters()[0]["reason"] == "corrupt_state"


def test_the_aggregate_is_exact_after_a_huge_value_left_the_slot(make_store):
    """The aggregate is the exact sum of the live slots, updated exactly: a huge value that left a slot
    leaves no rounding behind (a float update (agg − old) + new would end at −0.5)."""
    store = make_store()
    store.register({"motion/ema": merge(1, lifecycle="history")})
    a, b = store.shard(0), store.shard(1)
    for shard, v in ((a, 1e16), (b, 1.0), (a, 0.0), (b, 0.5)):  # an incremental (agg - old) + new ends at -0.5
        shard.publish({"motion/ema": {"count": 1, "sum": v}})
    assert scalar(store.fleet().keys["motion/ema"].parts()["sum"]) == 0.5


def test_the_fleet_value_is_the_correctly_rounded_sum_whatever_the_order_of_the_reports(make_store):
    """1 + 2⁻⁵³ + 2⁻⁵³ is 1 + 2⁻⁵² exactly: a float sum in any fixed order that meets 1 first loses
    both halves (1.0), the correctly rounded sum does not; the fleet value is the same whichever
    shard reported first and whichever folded last."""
    import math

    values = (1.0, 2.0**-53, 2.0**-53)
    for order in ((0, 1, 2), (2, 1, 0), (1, 0, 2)):
        store = make_store()
        store.register({"motion/ema": merge(1, lifecycle="state")})
        for shard in order:
            store.shard(shard).publish({"motion/ema": {"count": 1, "sum": values[shard]}})
        total = scalar(store.fleet().keys["motion/ema"].parts()["sum"])
        assert total == math.fsum(values) == 1.0 + 2.0**-52, (order, total)
        store.delete()


def test_a_sum_that_needs_more_than_two_planes_is_kept_exactly_and_shrinks_back(make_store):
    """1 + 2⁻⁶⁰ + 2⁻¹³⁰ needs three floats: the fold takes the general path, keeps three planes, and
    the state is the reference's bit for bit; when the small values leave, two planes again."""
    store = make_store()
    store.register(SCHEMA)
    shards = {shard: store.shard(shard) for shard in (0, 1, 2)}
    values = {0: [1.0, 1.0, 0.0, 1.0, 0.0], 1: [1.0, 2.0**-60, 0.0, 0.0, 0.0], 2: [1.0, 2.0**-130, 0.0, 0.0, 0.0]}
    for shard, v in values.items():
        shards[shard].publish({"obs/norm": {"count": v[0], "sum": v[1:3], "sumsq": v[3:]}})
    data = store.keys.key_data("obs/norm")
    assert len(store.redis.hget(data, "agg_lo")) == 2 * 5 * 8  # planes 2 and 3
    assert_matches_reference(store, values)
    for shard in (1, 2):
        values[shard] = [1.0, 0.5, 0.0, 0.0, 0.0]
        shards[shard].publish({"obs/norm": {"count": 1.0, "sum": [0.5, 0.0], "sumsq": [0.0, 0.0]}})
    assert len(store.redis.hget(data, "agg_lo")) == 5 * 8
    assert_matches_reference(store, values)
    assert float(store.fleet().keys["obs/norm"].parts()["sum"][0]) == 2.0


def test_an_earlier_layouts_history_is_taken_as_one_exact_plane_whatever_rest_was_left_beside_it(make_store):
    """A key an earlier redisync folded last (its sums_layout) may hold a retired history that fold
    changed beside a rest this layout wrote before: the next fold takes the history as one exact plane,
    writes it back in this layout's planes, and the fleet value is the exact sum with it."""
    from ...support import lua_state

    store = make_store()
    store.register({"obs/n": merge(1, lifecycle="history")})
    store.shard(0).publish({"obs/n": {"count": 1, "sum": 1.0}})
    store.shard(0, incarnation=2**62).publish({"obs/n": {"count": 1, "sum": 2.0}})  # a fresh life: 1.0 retired
    meta, data = store.keys.key_meta("obs/n"), store.keys.key_data("obs/n")
    store.redis.hset(meta, "sums_layout", "4/16/lone")
    store.redis.hset(data, "retired", codec.encode([np.array([1.0, 5.0])]))  # the earlier fold's history
    store.redis.hset(data, "retired_lo", codec.encode([np.array([2.0**-60, 0.0])]))  # a rest left from before
    store.shard(1).publish({"obs/n": {"count": 1, "sum": 4.0}})
    assert codec.decode(store.redis.hget(data, "retired_lo")).tolist() == [0.0, 0.0]
    state = lua_state(store)  # (asserts the stored planes are the exact sum of the history and the slots)
    assert state["keys"]["obs/n"]["value"].tolist() == [3.0, 11.0]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(-(2.0**1000), 2.0**1000, allow_nan=False, allow_infinity=False),
            st.floats(0.0, 2.0**1000, allow_nan=False, allow_infinity=False),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_exact_pieces_sum_exactly_stay_in_range_and_keep_non_negative_parts_non_negative(rows):
    """`exact_pieces` (what an aggregator forwards): the pieces' exact sum is the vectors' exact sum,
    every piece is within ±2^1000, a non-negative element's pieces are all non-negative, and a signed
    element needs no more than the canonical planes' few pieces plus one for each 2^1000 beyond."""
    from fractions import Fraction

    from redisync.store.semantics.merge import LIMIT, exact_pieces

    vectors = [np.array(r) for r in rows]
    pieces = exact_pieces(vectors, 2, [False, True])
    for j in range(2):
        assert sum(Fraction(float(p)) for p in pieces[:, j]) == sum(Fraction(float(v[j])) for v in vectors)
    assert np.all(np.abs(pieces) <= LIMIT)
    assert np.all(pieces[:, 1] >= 0)
    assert len(pieces) <= 3 + len(rows)
