"""Observers (inspect, watch, the exporter) judge a run's leases by the fold's own rule and clock
(leases.lua reads clock.lua's served clock without advancing it), and can tell a fleet that died
whole from a stalled server."""

from __future__ import annotations

import time

from redisync import inspection
from redisync.store.schema import Limits, Schema, merge

SCHEMA = Schema.of({"motion/ema": merge(2, lifecycle="state")})


def test_after_a_clock_step_back_the_observer_reads_the_folds_served_clock(make_store):
    """The server's clock steps back 10 s after the run's last call: the fold's clock stays where it
    was (clock.lua), so a lease ending 5 s past the server's new time has run out there; the observer
    says lapsed too (it said live: its own copy of the clock went back with the server's)."""
    store = make_store()
    store.register(SCHEMA)
    shard = store.shard(0)
    shard.publish({"motion/ema": {"count": 1.0, "sum": [1.0, 2.0]}})
    reading = store.leases()
    stepped = reading.now_us + 10_000_000  # the run's last call, as the server's clock had it before the step
    store.redis.hset(store.keys.meta, "clock_wall_us", str(stepped))
    store.redis.hset(store.keys.shards, "0:alive_until_us", str(reading.now_us + 5_000_000))
    assert store.leases().served_us >= stepped - 1  # the fold's clock did not go back
    assert inspection.shard_leases(store) == {0: "lapsed"}


def test_a_fleet_that_died_whole_lapses_for_an_observer_that_sees_the_server_serve(make_store):
    """Every collector of a run stops calling at once (SIGKILL of the fleet): the fold's clock no
    longer moves, so by it every lease stays live; an observer that sees the server answer for longer
    than the stall cap past the run's last call calls them lapsed (watch and the exporter keep such a
    ServiceWatch). A reader without one still says live: nothing moved its clock."""
    store = make_store()
    store.register(SCHEMA, Limits(stall_after_s=2.0))  # (looks 0.1 s apart stay within it on a loaded machine)
    shards = [store.shard(i) for i in range(2)]
    for i, shard in enumerate(shards):
        shard.publish({"motion/ema": {"count": 1.0, "sum": [1.0, float(i)]}})
        assert store.lease(i, shard.incarnation, 3000)  # longer than the stall cap
    watch = inspection.ServiceWatch()
    assert inspection.shard_leases(store, watch) == {0: "live", 1: "live"}
    deadline = time.monotonic() + 30
    seen = {}
    while time.monotonic() < deadline:
        seen = inspection.shard_leases(store, watch)
        if set(seen.values()) == {"lapsed"}:
            break
        time.sleep(0.1)
    assert seen == {0: "lapsed", 1: "lapsed"}
    assert inspection.shard_leases(store) == {0: "live", 1: "live"}  # the fold's clock alone: not moved


def test_a_stalled_server_lapses_nobody_for_the_observer(make_store):
    """The observer's looks with a gap longer than the stall cap between them (it could not see the
    server serve meanwhile): the gap is not counted, the leases stay live."""
    store = make_store()
    store.register(SCHEMA, Limits(stall_after_s=0.5))
    shard = store.shard(0)
    shard.publish({"motion/ema": {"count": 1.0, "sum": [1.0, 2.0]}})
    assert store.lease(0, shard.incarnation, 2000)
    watch = inspection.ServiceWatch()
    assert inspection.shard_leases(store, watch) == {0: "live"}
    time.sleep(1.0)  # no look for twice the stall cap: not evidence of service
    assert inspection.shard_leases(store, watch) == {0: "live"}
    assert watch.since_us == watch.last_us  # a new streak began at this look
