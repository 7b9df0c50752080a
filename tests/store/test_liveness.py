"""Liveness judged on evidence, bounded both ways: a stopped or dead collector leaves a state key,
a slow server drops nobody (leases run out in the run's served clock, ``lua/clock.lua``)."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

import redisync
from redisync.store.schema import Limits, merge

from ..servers import RedisProcess

GRACE_S = 1.5  # long beside a fold on a loaded machine: what must happen within it does
SCHEMA = {"motion/ema": merge(2, lifecycle="state", lease_grace_s=GRACE_S), "obs/norm": merge(2, lifecycle="history")}


def _publish(client, value: float) -> None:
    client.publish({"motion/ema": {"count": 1, "sum": [value, 1.0]}, "obs/norm": {"count": 2, "sum": [value, 1.0]}})


def _writers(store) -> bytes:
    return store.redis.hget(store.keys.key_meta("motion/ema"), "writers")


def _two_live_shards(make_store):
    """A run with shards 0 and 1 leased (60 s) and each folded once."""
    store = make_store()
    store.register(SCHEMA)
    a, b = store.shard(0), store.shard(1)
    for i, c in enumerate((a, b)):
        assert store.lease(i, c.incarnation, 60_000)
        _publish(c, i + 1.0)
    return store, a, b


def test_a_slot_written_after_its_lease_lapsed_lives_a_grace_past_that_write_and_no_longer(make_store):
    """A collector whose sidecar was paused past its lease publishes once more and dies: its slot
    counts for a grace past that publish, then leaves (it was kept for ever: 'it lived on')."""
    store, a, b = _two_live_shards(make_store)
    assert store.lease(1, b.incarnation, 1)  # shard 1's sidecar paused: no renewal
    time.sleep(GRACE_S + 0.3)  # past the lease and its grace
    _publish(b, 5.0)  # ... then its last publish (the collector's own, at stop), and the process exits
    _publish(a, 1.0)
    assert _writers(store) == b"0,1"  # within a grace of that write: counted
    time.sleep(GRACE_S + 0.3)  # a grace past the write, no renewal
    _publish(a, 1.0)
    assert _writers(store) == b"0"
    assert store.fleet().keys["obs/norm"].parts()["count"] == 4  # history keeps the dead shard's samples


def test_a_shard_that_gave_its_lease_up_leaves_a_state_key_at_the_next_fold(make_store):
    """A clean stop is not a pause: ``stop()`` gives the lease up after the last report, and the next
    fold of any shard leaves the stopped shard out of a state key (the history key keeps it)."""
    store, a, b = _two_live_shards(make_store)
    _publish(b, 2.0)  # its last report ...
    assert store.lease(1, b.incarnation, 0)  # ... and its lease given up
    _publish(a, 1.0)
    assert _writers(store) == b"0"
    np.testing.assert_array_equal(store.fleet().keys["motion/ema"].parts()["sum"], [1.0, 1.0])
    assert store.fleet().keys["obs/norm"].parts()["count"] == 4


def test_a_fold_judges_liveness_by_the_index_of_lease_ends_not_by_reading_every_writer(make_store):
    """After a key's first look, a fold reads only the shards whose lease ended (or was given up)
    since its last look, by score in the run's index (``lease_ends``, ``gave_up``): a writer's lease
    field changed behind the index's back (a lease marked given up by hand) is not seen; a key looked
    at afresh (its last look forgotten, as a restore forgets it) reads every writer and drops it. The
    same, by the writers' write times, for ``stale_after_s``."""
    store, a, b = _two_live_shards(make_store)
    c = store.shard(2)
    assert store.lease(2, c.incarnation, 60_000)
    _publish(c, 3.0)
    meta = store.keys.key_meta("motion/ema")
    assert store.redis.zscore(store.keys.lease_ends, "2") is not None
    store.redis.hset(store.keys.shards, "2:alive_until_us", "-1")  # given up, but not through lease.lua
    _publish(a, 1.0)
    assert _writers(store) == b"0,1,2"  # not in the index's window: not read
    store.redis.hdel(meta, "lapse_seen")  # the key's last look forgotten
    _publish(a, 1.0)
    assert _writers(store) == b"0,1"
    assert store.lease(1, b.incarnation, 0)  # a give-up through lease.lua: in the index
    _publish(a, 1.0)
    assert _writers(store) == b"0"
    assert int(store.redis.hget(store.keys.meta, "gave_up_seq")) == 1


def test_a_restore_makes_each_state_keys_next_fold_look_at_every_writer(make_store):
    """A restore brings back the snapshot's slots, not the run's liveness indexes: each key's last
    look is forgotten and its index of write times dropped, so its next fold looks at every writer."""
    store = make_store()
    store.register({"motion/ema": merge(2, lifecycle="state", stale_after_s=60.0)})
    a, b = store.shard(0), store.shard(1)
    for i, c in enumerate((a, b)):
        c.publish({"motion/ema": {"count": 1, "sum": [float(i), 1.0]}})
    meta, written = store.keys.key_meta("motion/ema"), store.keys.written("motion/ema")
    assert store.redis.hget(meta, "stale_seen") is not None
    assert store.redis.zcard(written) == 2
    store.restore(store.snapshot())
    assert store.redis.hget(meta, "stale_seen") is None
    assert store.redis.hget(meta, "lapse_seen") is None
    assert store.redis.zcard(written) == 0
    store.redis.hset(meta, "slot:1:at_us", "1")  # written long ago: stale
    a.publish({"motion/ema": {"count": 2, "sum": [0.0, 1.0]}})
    assert store.redis.hget(meta, "writers") == b"0"
    assert store.redis.zcard(written) == 1


@pytest.mark.integration
def test_a_server_stall_longer_than_every_lease_drops_no_shard_that_renews(tmp_path):
    """A server paused for 6 s (a paused VM; a fold of the largest key, a fork, a clock step do the
    same) with 3 s leases and a 1.5 s grace: by the wall clock every lease lapsed, yet the first fold
    after the stall keeps every live shard (they all renew once the server answers again)."""
    server = RedisProcess(tmp_path).start()
    try:
        store = redisync.connect(server.url, run="stall")
        store.register(SCHEMA, Limits(stall_after_s=1.0))
        clients = [store.shard(i) for i in range(3)]
        for i, c in enumerate(clients):
            assert store.lease(i, c.incarnation, 3_000)
            _publish(c, i + 1.0)
        server.proc.send_signal(signal.SIGSTOP)
        time.sleep(6.0)
        server.proc.send_signal(signal.SIGCONT)
        _publish(clients[0], 1.0)  # the first fold after the stall, before the others renewed
        assert _writers(store) == b"0,1,2"
        meta = store.redis.hgetall(store.keys.key_meta("motion/ema"))
        assert b"dropped_lapsed" not in meta
        for i, c in enumerate(clients):
            assert store.lease(i, c.incarnation, 3_000)
        # a shard that then dies still leaves: its lease runs out as the others' calls go on
        for _ in range(10):
            time.sleep(0.5)
            for i in (0, 2):
                assert store.lease(i, clients[i].incarnation, 3_000)
        _publish(clients[0], 1.0)
        assert _writers(store) == b"0,2"
    finally:
        server.kill()
