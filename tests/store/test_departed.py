"""A run's memory follows its live fleet: a departed shard's history slot is retired into the exact
retired planes after its grace (its samples kept, bit for bit), and a departed shard id leaves the
run's shards hash and indexes once no key holds it (``lua/lease.lua``). Each test decides by the
store's contents after waiting past a grace, never by how fast anything happened."""

from __future__ import annotations

import math
import time

import numpy as np

from redisync.store.schema import Limits, merge
from redisync.store.semantics.merge import exact_planes, planes_of

RETIRE_S = 1.0  # long beside a fold on a loaded machine: what must not happen within it does not
HISTORY = {"obs/norm": merge(2, lifecycle="history", retire_after_s=RETIRE_S)}
LONG_MS = 600_000  # a live shard's lease in these tests: never runs out while they run


def _data(store, name="obs/norm") -> dict:
    return {k.decode(): v for k, v in store.redis.hgetall(store.keys.key_data(name)).items()}


def _meta(store, name="obs/norm") -> dict:
    return {k.decode(): v.decode() for k, v in store.redis.hgetall(store.keys.key_meta(name)).items()}


def _shard_ids(store) -> set[int]:
    return {int(f.decode().split(":")[0]) for f in store.redis.hkeys(store.keys.shards)}


def _leased(store, shard_id: int):
    client = store.shard(shard_id)
    client.publish({"obs/norm": {"count": 0, "sum": [0.0, 0.0]}})  # (claims its incarnation)
    assert store.lease(shard_id, client.incarnation, LONG_MS)
    return client


def test_a_departed_history_slot_is_retired_exactly_after_its_grace_and_not_before(make_store):
    """Shard 1's lease ends; within ``retire_after_s`` its slot stays a slot, after it the next fold
    (of another shard) moves it into the retired planes: the aggregate's bytes do not move, the
    retired planes are the exact sum of what was retired, the key holds no field of shard 1."""
    store = make_store()
    store.register(HISTORY)
    a, b, c = (_leased(store, i) for i in range(3))
    reports = {0: [0.1, 1e300], 1: [0.2, -1e300], 2: [-0.3, 1.0]}
    for client, i in ((a, 0), (b, 1), (c, 2)):
        client.publish({"obs/norm": {"count": i + 1, "sum": reports[i]}})
    agg = _data(store)["agg"], _data(store)["agg_lo"]
    assert store.lease(1, b.incarnation, 1)  # shard 1's lease runs out (1 ms) and is not renewed
    a.publish({"obs/norm": {"count": 1, "sum": reports[0]}})
    assert _meta(store)["writers"] == "0,1,2"  # within its grace: a slot still
    time.sleep(RETIRE_S + 0.3)
    a.publish({"obs/norm": {"count": 1, "sum": reports[0]}})
    meta, data = _meta(store), _data(store)
    assert meta["writers"] == "0,2"
    assert "slot:1" not in data
    assert not any(f.startswith("slot:1:") for f in meta)
    assert meta["retired_departed"] == "1"
    assert (data["agg"], data["agg_lo"]) == agg  # the exact sum did not move
    slot_1 = np.array([2.0, *reports[1]])
    np.testing.assert_array_equal(planes_of(data["retired"], data["retired_lo"], 3), exact_planes([slot_1], 3))
    fleet = store.fleet().keys["obs/norm"].parts()
    assert fleet["count"] == 1 + 2 + 3
    np.testing.assert_array_equal(fleet["sum"], [math.fsum([0.1, 0.2, -0.3]), 1.0])


def test_a_given_up_history_slot_waits_its_grace_so_a_resumed_shard_takes_it_over(make_store):
    """A clean stop gives the lease up; the history key keeps the slot for ``retire_after_s`` from
    that moment, so the shard resumed from its checkpoint takes it over (counted once). Given up
    again and gone past its grace, it is retired: counted once still."""
    store = make_store()
    store.register(HISTORY)
    a, b = _leased(store, 0), _leased(store, 1)
    a.publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    b.publish({"obs/norm": {"count": 5, "sum": [5.0, 5.0]}})
    assert store.lease(1, b.incarnation, 0)  # a clean stop
    a.publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    assert _meta(store)["writers"] == "0,1"  # a give-up is not a departure for a history key yet
    resumed = store.shard(1, resume=True)  # its checkpoint holds 4 of the 5 samples
    resumed.publish({"obs/norm": {"count": 4, "sum": [4.0, 4.0]}})
    assert store.fleet().keys["obs/norm"].parts()["count"] == 1 + 4
    assert store.lease(1, resumed.incarnation, 0)
    time.sleep(RETIRE_S + 0.3)
    a.publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    assert _meta(store)["writers"] == "0"
    assert store.fleet().keys["obs/norm"].parts()["count"] == 1 + 4


def test_a_departed_id_leaves_the_shards_hash_and_indexes_once_no_key_holds_it(make_store):
    """Shard 1 stops; twice the longest grace later, a renewal forgets it only when every key has
    let its slot go: a key not folded since still holds it (kept), and after that key's next fold
    the id's fields and index entries are gone."""
    store = make_store()
    store.register(
        {
            "motion/ema": merge(2, lifecycle="state", lease_grace_s=RETIRE_S / 2),
            "obs/norm": merge(2, lifecycle="history", retire_after_s=RETIRE_S / 2),
        }
    )
    assert store.redis.hget(store.keys.meta, "forget_after_us") == b"%d" % (2e6 * RETIRE_S / 2)
    both = {"motion/ema": {"count": 1, "sum": [1.0, 1.0]}, "obs/norm": {"count": 1, "sum": [1.0, 1.0]}}
    a, b = store.shard(0), store.shard(1)
    for i, client in enumerate((a, b)):
        client.publish(both)
        assert store.lease(i, client.incarnation, LONG_MS)
    assert store.lease(1, b.incarnation, 0)
    time.sleep(RETIRE_S + 0.3)
    a.publish({"motion/ema": both["motion/ema"]})  # the state key lets shard 1 go; the history key is not folded
    for _ in range(3):
        assert store.lease(0, a.incarnation, LONG_MS)
    assert 1 in _shard_ids(store)  # the history key still holds its slot
    a.publish({"obs/norm": both["obs/norm"]})  # retired there too
    for _ in range(3):
        assert store.lease(0, a.incarnation, LONG_MS)
    assert _shard_ids(store) == {0}
    assert store.redis.zrange(store.keys.lease_ends, 0, -1) == [b"0"]
    assert store.redis.zrange(store.keys.gave_up, 0, -1) == []
    assert store.redis.hget(store.keys.meta, "forgotten_ids") == b"1"
    assert store.fleet().keys["obs/norm"].parts()["count"] == 2  # shard 1's sample counted still
    # a shard that comes back under a forgotten id is a new shard: it claims and folds as one
    again = store.shard(1)
    again.publish(both)
    assert _meta(store)["writers"] == "0,1"
    assert store.fleet().keys["obs/norm"].parts()["count"] == 3


def test_a_churning_fleet_holds_what_its_live_shards_hold(make_store):
    """Forty shard ids come, report and stop beside two live ones: once their graces have passed
    and the live shards folded and renewed, the run holds the live shards' fields and no more -
    the same fields as two live shards alone - and every sample that passed is counted exactly."""
    store = make_store()
    store.register(
        {
            "motion/ema": merge(2, lifecycle="state", lease_grace_s=RETIRE_S / 2),
            "obs/norm": merge(2, lifecycle="history", retire_after_s=RETIRE_S / 2),
        }
    )
    one = {"motion/ema": {"count": 1, "sum": [1.0, 1.0]}, "obs/norm": {"count": 1, "sum": [0.1, 1.0]}}
    live = [store.shard(0), store.shard(1)]
    for i, client in enumerate(live):
        client.publish(one)
        assert store.lease(i, client.incarnation, LONG_MS)

    def fields() -> dict[str, int]:
        r, out = store.redis, {}
        for name in ("motion/ema", "obs/norm"):
            for kind, key in (("meta", store.keys.key_meta(name)), ("data", store.keys.key_data(name))):
                out[f"{name} {kind}"] = sum(1 for f in r.hkeys(key) if f.startswith(b"slot:"))
        out["shards"] = r.hlen(store.keys.shards)
        out["lease_ends"] = r.zcard(store.keys.lease_ends)
        out["gave_up"] = r.zcard(store.keys.gave_up)
        return out

    with_live = fields()
    for shard_id in range(2, 42):
        client = store.shard(shard_id)
        client.publish(one)
        assert store.lease(shard_id, client.incarnation, LONG_MS)
        assert store.lease(shard_id, client.incarnation, 0)
    assert fields()["shards"] > with_live["shards"] + 40
    time.sleep(RETIRE_S + 0.3)
    for _ in range(25):  # each renewal forgets at most two departed ids
        for i, client in enumerate(live):
            client.publish(one)
            assert store.lease(i, client.incarnation, LONG_MS)
    assert fields() == with_live
    norm = store.fleet().keys["obs/norm"].parts()
    assert norm["count"] == 42
    assert norm["sum"][0] == math.fsum([0.1] * 42)


def test_a_run_stopped_whole_does_not_age_so_its_shards_resume_their_slots(make_store):
    """Retirement counts in the run's served clock, which stops with the run's calls: a run stopped
    whole (every shard gave its lease up) and resumed long after its grace has retired nothing, and
    each shard resumed from its checkpoint takes its own slot over - counted once. (A gap between
    the run's calls counts at most ``stall_after_s``.)"""
    store = make_store()
    store.register(HISTORY, Limits(stall_after_s=0.1))
    clients = [_leased(store, i) for i in range(3)]
    for i, client in enumerate(clients):
        client.publish({"obs/norm": {"count": 10 * (i + 1), "sum": [1.0, 1.0]}})
    for i, client in enumerate(clients):
        assert store.lease(i, client.incarnation, 0)  # the run stopped: every lease given up
    time.sleep(RETIRE_S + 0.5)  # the night: no call reaches the run
    resumed = [store.shard(i, resume=True) for i in range(3)]
    resumed[0].publish({"obs/norm": {"count": 11, "sum": [1.0, 1.0]}})  # the first back folds ...
    assert _meta(store)["writers"] == "0,1,2"  # ... and retires nobody: the run did not age
    assert "retired_departed" not in _meta(store)
    for i in (1, 2):
        resumed[i].publish({"obs/norm": {"count": 10 * (i + 1) + 1, "sum": [1.0, 1.0]}})
    assert store.fleet().keys["obs/norm"].parts()["count"] == 11 + 21 + 31
