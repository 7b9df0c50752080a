"""An observer's reads of a run (`redisync.store.reads`, and the server-wide ones of `connection`)."""

from __future__ import annotations

import numpy as np
import pytest

from redisync import errors
from redisync.store.schema import Schema, broadcast, merge

SCHEMA = Schema.of({"obs/n": merge(2, lifecycle="history"), "cfg/x": broadcast(1)})


def test_the_reads_say_what_the_folds_left(make_store):
    """Streams, shards, a key's data fields and the run's names and epoch, as the folds left them."""
    store = make_store()
    other = make_store()
    store.register(SCHEMA)
    other.register(SCHEMA)
    shard = store.shard(3)
    shard.publish({"obs/n": {"count": 2.0, "sum": np.array([1.0, 3.0])}})
    shard.publish({"cfg/x": {"value": np.array([7.0])}})
    with pytest.raises(errors.InvalidReport):  # refused by the server (past the client's checks): dead-lettered
        shard.publish_payloads({"obs/n": np.array([1.0, np.nan, 0.0]).tobytes()}, shard.seq + 1)
    assert store.stream_lengths() == (2, 1)  # two folds; one report refused
    assert store.dead_letter_count() == 1
    info = store.shards_info()
    assert info["3:seq"] == str(shard.seq)  # the refused fold's seq is not the shard's last folded
    assert info["3:incarnation"] == str(shard.incarnation)
    assert "3:at_us" in info
    value = store.key_fields("cfg/x", ["value"])
    assert np.frombuffer(value[0]).tolist() == [7.0]
    assert store.key_fields("cfg/x", []) == []
    assert {store.run, other.run} <= set(store.run_names())
    assert store.run_epoch(other.run) == other.run_info()["epoch"].encode()
    assert store.run_epoch("never-registered-run") is None
    assert store.primaries() == []  # not a Cluster


def test_the_servers_clock_is_the_one_that_stamps_the_slots(make_store):
    """`server_time_us` reads the clock a fold stamps its slots with (not this host's)."""
    store = make_store()
    store.register(SCHEMA)
    before = store.server_time_us()
    store.shard(0).publish({"obs/n": {"count": 1.0, "sum": np.ones(2)}})
    stamped = int(store.shards_info()["0:at_us"])
    assert before <= stamped <= store.server_time_us()
