"""Shared state between a collector and its sidecar: a report is never copied half written, a
staged fleet state is never taken half written, and a term that declares what cannot be shared
is told so, typed."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from redisync import broadcast, merge
from redisync.collector.shared_state import NOT_SHARED, SharedState, SidecarState
from redisync.errors import InvalidSchema
from redisync.store.codec import KeyView, PullResult
from redisync.store.schema import Schema

SCHEMA = Schema.of({"a/stats": merge(500, sumsq=True, lifecycle="history"), "b/value": broadcast(300)})


def _reader(layout, snapshots: int, out) -> None:
    state, seen, last = SidecarState(layout), [], -1
    while len(seen) < snapshots:
        got = state.snapshot()
        if got is None or got[0] == last:
            continue
        last, reports = got
        total, value = reports["a/stats"]["sum"], reports["b/value"]["value"]
        seen.append(
            (
                float(total[0]),
                bool(np.all(total == total[0]) and np.all(value == total[0])),
                reports["a/stats"]["count"] == 1.0,
            )
        )
    out.put(seen)


def test_the_sidecar_never_copies_a_report_half_written():
    """A reader in another process racing the collector's in-place updates copies whole reports only."""
    shared = SharedState(SCHEMA)
    a = shared.array(np.zeros((2, 500)))  # sum, sumsq
    b = shared.array(np.zeros(300, dtype=np.float32))
    shared.report("a/stats", count=1.0, sum=a[0], sumsq=a[1])
    shared.report("b/value", value=b)
    out = mp.get_context("spawn").Queue()
    reader = mp.get_context("spawn").Process(target=_reader, args=(shared.layout(), 300, out))
    reader.start()
    try:
        i = 0
        while reader.is_alive() and out.empty():
            i += 1
            shared.begin()  # three writes a reader could land between
            a[0] = i
            a[1] = i
            b[:] = i
            shared.end()
        seen = out.get(timeout=30)
    finally:
        reader.join(timeout=30)
        shared.release()
    assert len(seen) == 300
    assert all(whole for _, whole, _ in seen), "a snapshot mixed two writes"
    assert all(count for *_, count in seen)  # the constant part
    values = [v for v, _, _ in seen]
    assert values == sorted(values)
    assert values[-1] > values[0]


def _stager(layout, versions: int) -> None:
    state = SidecarState(layout)
    for version in range(1, versions + 1):
        keys = {
            "a/stats": KeyView(
                "a/stats", SCHEMA.keys["a/stats"], version, np.full(1001, float(version)), np.full(1001, 0.5)
            ),
            "b/value": KeyView("b/value", SCHEMA.keys["b/value"], version, np.full(300, float(version))),
        }
        state.stage(PullResult("epoch", version, False, keys, 0))


def test_a_staged_fleet_state_is_taken_whole_and_only_newer():
    """A fleet state staged by another process is taken whole (never two stagings mixed) and only
    when newer than the one taken."""
    shared = SharedState(SCHEMA)
    others = shared.receive("a/stats", "sum")
    count, value = shared.receive("a/stats", "count"), shared.receive("b/value", "value")
    stager = mp.get_context("spawn").Process(target=_stager, args=(shared.layout(), 20000))
    stager.start()
    taken = []
    try:
        while stager.is_alive() or shared.staged[0] != shared.taken:
            if shared.take():
                # merge: the others' aggregate (the fleet value without our slot); broadcast: the value
                v = shared.applied
                assert np.all(others == v - 0.5), "a take mixed two states"
                assert float(count) == v - 0.5, "a take mixed two states"
                assert np.all(value == v), "a take mixed two states"
                taken.append(v)
    finally:
        stager.join(timeout=30)
        shared.release()
    assert taken == sorted(set(taken))
    assert taken[-1] == 20000


def test_what_cannot_be_shared_is_refused_typed():
    """A key or part the schema does not have, or a buffer of another layout, is refused with a typed error."""
    shared = SharedState(SCHEMA)
    try:
        own = shared.array(np.zeros((2, 500)))
        with pytest.raises(InvalidSchema, match="not a key of the run's schema"):
            shared.report("nope", sum=own[0])
        with pytest.raises(InvalidSchema, match="part 'value' is not one of"):
            shared.report("a/stats", value=own[0])
        with pytest.raises(InvalidSchema, match="not a contiguous slice of a shared array"):
            shared.report("a/stats", sum=np.zeros(500))  # private memory: the sidecar could not see it
        with pytest.raises(InvalidSchema, match="not a contiguous slice"):
            shared.report("a/stats", sum=own[:, 0])  # strided
        with pytest.raises(InvalidSchema, match="part 'sum' is not one of"):
            shared.receive("b/value", "sum")
        with pytest.raises(InvalidSchema, match="not a key of the run's schema"):
            shared.receive("nope", "sum")
        assert shared.parts == []
        assert shared.received == []
    finally:
        shared.release()
    NOT_SHARED.begin()  # an unshared term's brackets cost nothing and do nothing
    NOT_SHARED.end()
    assert NOT_SHARED.applied == 0
