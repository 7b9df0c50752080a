"""Fuzzed bad input: malformed reports on the client, forged script arguments on the server.

Every case must end in a typed error, a fleet state byte-identical to the one before, and — for
the server-side cases — the rejection kept in the dead-letter stream. 1 200 cases per backend.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from redisync import errors
from redisync.store.codec import parse_publish
from redisync.store.schema import Limits, Schema, broadcast, merge

from ..conftest import examples, new_store

SCHEMA = Schema.of(
    {
        "motion/bin_failed": merge(6, stale_after_s=60, lifecycle="state"),
        "obs/norm": merge(3, sumsq=True, lifecycle="history"),
        "curriculum/scale": broadcast((), owner=0),
    }
)
LIMITS = Limits(max_report_bytes=100)  # one key fits (56 bytes at most), two do not
SHARD, INC = 1, 1_000
CASES = examples(1200)

bad_numbers = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1e-300, 1e308 * 10])
junk = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.lists(st.text(max_size=2), max_size=3),
)


@st.composite
def bad_client_report(draw):
    """A report the client must refuse before sending anything."""
    name = draw(st.sampled_from([*list(SCHEMA.keys), "nope/key", "motion/other"]))
    kind = draw(st.sampled_from(["value", "shape", "junk", "extra", "missing", "unknown", "huge"]))
    size = 6 if name == "motion/bin_failed" else 3
    good = {"count": 1.0, "sum": np.ones(size)} | ({"sumsq": np.ones(size)} if name == "obs/norm" else {})
    if name == "curriculum/scale":
        good = {"value": 0.5}
    if name not in SCHEMA.keys or kind == "unknown":
        return {draw(st.sampled_from(["nope/key", "x/y", "motion/other"])): good}
    report = dict(good)
    field = draw(st.sampled_from(sorted(report)))
    if kind == "value":
        arr = np.array(report[field], dtype=float, ndmin=1).copy()
        arr[draw(st.integers(0, arr.size - 1))] = draw(
            bad_numbers if field in ("count", "sumsq") else bad_numbers.filter(lambda v: not (v < 0 and v > -math.inf))
        )
        report[field] = arr if np.ndim(good[field]) else arr[0]
    elif kind == "shape":
        report[field] = np.ones(draw(st.sampled_from([(2,), (7,), (2, 2), (size + 1,)])))
    elif kind == "junk":
        report[field] = draw(junk)
    elif kind == "extra":
        report[draw(st.sampled_from(["extra", "mean", "value", "count2"]))] = 1.0
        if set(report) <= set(good):
            report["extra"] = 1.0
    elif kind == "missing":
        del report[field]
        if not report:
            report = {"sumsq": 1.0}
    else:  # a payload over the run's max_report_bytes: two keys
        return {
            "obs/norm": {"count": 1.0, "sum": np.ones(3), "sumsq": np.ones(3)},
            "motion/bin_failed": {"count": 1.0, "sum": np.ones(6)},
        }
    return {name: report}


def f64(values) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


@st.composite
def forged_call(draw):
    """Script arguments a client that skips validation could send; each must be refused."""
    kind = draw(
        st.sampled_from(
            [
                "value",
                "length",
                "unknown",
                "non_utf8",
                "not_owner",
                "zombie",
                "other_shard",
                "rollback",
                "digest",
                "ids",
                "too_large",
            ]
        )
    )
    name = draw(st.sampled_from(["motion/bin_failed", "obs/norm"]))
    width = 7  # (both keys: 1 + 6)
    values = [1.0] * width
    shard, inc, seq, digest = str(SHARD), str(INC), str(draw(st.integers(10, 10**6))), None
    items = [(name.encode(), None)]
    if kind == "value":
        values[draw(st.integers(0, width - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        if draw(st.booleans()):  # or a negative count / sumsq
            values = [1.0] * width
            values[draw(st.sampled_from([0] + ([4, 5, 6] if name == "obs/norm" else [])))] = -draw(
                st.floats(1e-300, 1e300)
            )
    elif kind == "length":
        payload = draw(st.binary(max_size=80).filter(lambda b: len(b) != 8 * width))
        items = [(name.encode(), payload)]
    elif kind == "unknown":
        items = [(draw(st.sampled_from([b"nope/key", b"motion/bin", b"curriculum/stage"])), f64(values))]
    elif kind == "non_utf8":
        items = [(b"\xff\xfe/" + draw(st.binary(min_size=1, max_size=4)), f64(values))]
    elif kind == "not_owner":
        items = [(b"curriculum/scale", f64([draw(st.floats(-10, 10))]))]
    elif kind == "zombie":
        inc = str(draw(st.integers(1, INC - 1)))
    elif kind == "other_shard":  # another shard's id with an incarnation older than that shard's
        shard, inc = "0", str(draw(st.integers(1, INC - 1)))
    elif kind == "rollback":
        seq = str(draw(st.integers(0, 1)))
    elif kind == "too_large":
        items = [(b"motion/bin_failed", None), (b"obs/norm", None)]
    elif kind == "digest":
        digest = draw(st.text(alphabet="0123456789abcdef", min_size=1, max_size=40))
    else:
        field = draw(st.sampled_from(["shard", "inc", "seq"]))
        bad = draw(st.sampled_from(["", "-1", "1.5", "0x10", "01", " 1", "9" * 25, "abc"]))
        if field == "shard":
            shard = bad if bad not in ("01",) else "007"
        elif field == "inc":
            inc = bad if bad != "01" else "0"
        else:
            seq = bad if bad not in ("01",) else "9" * 16
    floor = "0"
    if kind == "ids" and draw(st.booleans()):
        floor = draw(st.sampled_from(["", "-1", "1.5", "9" * 16, "x"]))
    items = [(n, f64(values) if p is None else p) for n, p in items]
    return kind, digest, shard, inc, seq, floor, items


@pytest.fixture(scope="module", params=["embedded", "real"])
def fuzz_store(request):
    store = new_store(request.param)
    store.register(SCHEMA, LIMITS)
    clients = {sid: store.shard(sid, incarnation=INC) for sid in (0, SHARD)}  # both shards have state to protect
    for client in clients.values():
        client.publish({"motion/bin_failed": {"count": 1, "sum": np.arange(6.0)}})
        client.publish({"obs/norm": {"count": 3, "sum": [1, 2, 3], "sumsq": [1, 4, 9]}})
    clients[0].publish({"curriculum/scale": {"value": 0.25}})
    yield store
    store.delete()


def state(store) -> dict:
    return store.snapshot().hashes


@settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(report=bad_client_report())
def test_client_refuses_malformed_reports(fuzz_store, report):
    """A malformed report is refused on the client with a typed error, and nothing reaches the store."""
    store = fuzz_store
    client = store.shard(SHARD, incarnation=INC)
    client.seq = 10**6
    dead = store.redis.xlen(store.keys.dead_letters)
    before = state(store)
    with pytest.raises(errors.InvalidReport) as info:
        client.publish(report)
    event(info.value.reason)
    assert isinstance(info.value, ValueError)
    assert info.value.reason != "invalid"
    assert state(store) == before
    assert store.redis.xlen(store.keys.dead_letters) == dead


@settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(call=forged_call())
def test_server_refuses_forged_arguments(fuzz_store, call):
    """Forged arguments sent straight to the fold are refused by the server with a typed error, change nothing
    of the run's state, and leave one dead letter with the reason."""
    store = fuzz_store
    kind, digest, shard, inc, seq, floor, items = call
    k = store.keys
    keys = [k.meta, k.shards, k.reports, k.dead_letters]
    for name, _ in items:
        keys += [k.prefix.encode() + b"key:" + name, k.prefix.encode() + b"data:" + name]
    args = [digest or store.schema.digest, shard, inc, seq, floor] + [x for item in items for x in item]
    dead = store.redis.xlen(store.keys.dead_letters)
    before = state(store)
    with pytest.raises(errors.InvalidReport) as info:
        parse_publish(store.scripts.fold(keys=keys, args=args), [])
    event(f"{kind} -> {info.value.reason}")
    assert isinstance(info.value, errors.RedisyncError), kind
    assert info.value.reason != "invalid", kind
    assert state(store) == before, kind
    assert store.redis.xlen(store.keys.dead_letters) == dead + 1, kind
    assert store.dead_letters(1)[0]["reason"] == info.value.reason
