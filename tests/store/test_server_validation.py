"""A client that skips validation: the fold script refuses every forged argument by itself.

Each case calls the script directly, then requires a typed error, a fleet state that is
byte-identical to the one before, and the rejection in the dead-letter stream.
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from redisync import errors
from redisync.store.codec import encode, parse_publish
from redisync.store.schema import Limits, Schema, broadcast, merge

SCHEMA = Schema.of(
    {
        "motion/bin_failed": merge(4, lifecycle="history"),
        "obs/norm": merge(2, sumsq=True, lifecycle="history"),
        "curriculum/scale": broadcast((), owner=0),
    }
)


def f64(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


GOOD_BINS = f64(1, 0.5, 0.5, 0.5, 0.5)  # count, then sum[4]


@pytest.fixture
def run(make_store):
    store = make_store()
    store.register(SCHEMA, Limits(max_report_bytes=1000))
    shard = store.shard(1, incarnation=500)
    shard.publish({"motion/bin_failed": {"count": 1, "sum": 0.25}})  # seq 1: some state to protect
    return store, shard


def forge(
    store,
    *,
    keys=None,
    digest=None,
    shard="1",
    inc="500",
    seq="2",
    items=(("motion/bin_failed", GOOD_BINS),),
    resume=None,
):
    k = store.keys

    def named(n):  # names may be forged bytes
        p = k.prefix.encode()
        n = n if isinstance(n, bytes) else n.encode()
        return (p + b"key:" + n, p + b"data:" + n)

    keys = keys or [k.meta, k.shards, k.reports, k.dead_letters] + [x for n, _ in items for x in named(n)]
    resume = "0" * len(items) if resume is None else resume
    args = [digest or store.schema.digest, shard, inc, seq, "0", resume] + [x for item in items for x in item]
    return store.scripts.fold(keys=keys, args=args)


CASES = {
    "nan": (dict(items=(("motion/bin_failed", f64(1, 0, float("nan"), 0, 0)),)), "non_finite", "motion/bin_failed"),
    "inf": (dict(items=(("obs/norm", f64(1, 0, 0, float("inf"), 0)),)), "non_finite", "obs/norm"),
    "-inf": (dict(items=(("curriculum/scale", f64(float("-inf"))),), shard="0"), "non_finite", "curriculum/scale"),
    "negative count": (dict(items=(("motion/bin_failed", f64(-1, 0, 0, 0, 0)),)), "negative", "motion/bin_failed"),
    "negative sumsq": (dict(items=(("obs/norm", f64(1, -5, 0, 0, -2)),)), "negative", "obs/norm"),
    "truncated": (dict(items=(("motion/bin_failed", GOOD_BINS[:-3]),)), "shape", "motion/bin_failed"),
    "too long": (dict(items=(("motion/bin_failed", GOOD_BINS + f64(1)),)), "shape", "motion/bin_failed"),
    "unknown key": (dict(items=(("nope/key", f64(1)),)), "unknown_key", "nope/key"),
    "non-utf8 key": (dict(items=((b"\xff\xfe/x", f64(1)),)), "unknown_key", None),
    "not owner": (dict(items=(("curriculum/scale", f64(2.0)),)), "not_owner", "curriculum/scale"),
    "schema digest": (dict(digest="0" * 40), "schema_mismatch", None),
    "zombie incarnation": (dict(inc="499"), "stale_incarnation", None),
    "seq rollback": (dict(seq="0"), "seq_rollback", None),
    "shard id not a number": (dict(shard="one"), "malformed", None),
    "negative seq": (dict(seq="-3"), "malformed", None),
    "zero incarnation": (dict(inc="0"), "malformed", None),
    "key reported twice": (
        dict(items=(("motion/bin_failed", GOOD_BINS), ("motion/bin_failed", GOOD_BINS))),
        "malformed",
        "motion/bin_failed",
    ),
    "missing payload": (dict(items=(("motion/bin_failed",),)), "malformed", None),
    "resume flag not 0 or 1": (dict(resume="2"), "malformed", None),
    "resume flags miscounted": (dict(resume="00"), "malformed", None),
    "too large": (dict(items=(("motion/bin_failed", GOOD_BINS), ("obs/norm", f64(*[1] * 5)))), "too_large", None),
}


def state_bytes(store) -> dict:
    return store.snapshot().hashes


@pytest.mark.parametrize("case", sorted(CASES))
def test_forged_reports_are_refused_and_change_nothing(run, case):
    """A forged report (bad shape, size, value, identity) sent past the client's checks is refused by the
    server and changes nothing."""
    store, _ = run
    kwargs, reason, key = CASES[case]
    if case == "too large":  # 80 bytes of valid payload against a 50-byte limit
        store.redis.hset(store.keys.meta, "limits", Limits(max_report_bytes=50).packed())
    if case == "missing payload":
        k = store.keys
        kwargs = dict(
            kwargs,
            keys=[
                k.meta,
                k.shards,
                k.reports,
                k.dead_letters,
                k.key_meta("motion/bin_failed"),
                k.key_data("motion/bin_failed"),
            ],
        )
    before = state_bytes(store)
    dead_before = store.redis.xlen(store.keys.dead_letters)
    with pytest.raises(errors.InvalidReport) as info:
        parse_publish(forge(store, **kwargs), [])
    assert isinstance(info.value, ValueError)
    assert info.value.reason == reason
    if key:
        assert info.value.key == key
        assert key in str(info.value)
    assert state_bytes(store) == before
    assert store.redis.xlen(store.keys.dead_letters) == dead_before + 1
    newest = store.dead_letters(1)[0]
    assert newest["reason"] == reason
    assert newest["shard"] == kwargs.get("shard", "1")


def test_forged_key_names_cannot_reach_other_keys(run):
    """A fold called with another run's keys is refused without touching them."""
    store, _ = run
    before = state_bytes(store)
    foreign = ["redisync:{other}:shards", "redisync:{other}:reports", "redisync:{other}:dead"]
    k = store.keys
    reply = forge(store, keys=[k.meta, *foreign, k.key_meta("motion/bin_failed"), k.key_data("motion/bin_failed")])
    with pytest.raises(errors.MalformedReport, match="KEYS"):
        parse_publish(reply, [])
    reply = forge(store, keys=[k.meta, k.shards, k.reports, k.dead_letters, "victim", "victim2"])
    with pytest.raises(errors.MalformedReport, match="KEYS do not match"):
        parse_publish(reply, [])
    assert state_bytes(store) == before
    assert store.redis.exists("victim") == 0
    assert store.redis.exists("redisync:{other}:dead") == 0


def test_a_report_applies_all_or_none(run):
    """A report whose second key is bad applies none of its keys."""
    store, shard = run
    before = state_bytes(store)
    good = encode([np.ones(1), np.ones(4)])
    bad = encode([np.ones(1), np.array([0.0, np.nan]), np.ones(2)])
    with pytest.raises(errors.NonFiniteValue):
        shard.publish_payloads({"motion/bin_failed": good, "obs/norm": bad}, seq=7)
    assert state_bytes(store) == before
    assert store.dead_letters(1)[0]["report:motion/bin_failed"] == good  # the whole report is kept


def test_a_non_redisync_meta_key_is_refused_without_writing(run):
    """A fold called on a key that is not a run's meta key is refused before reading its arguments."""
    store, _ = run
    reply = store.scripts.fold(keys=["some:other:key"], args=["x"])  # refused before reading any ARGV
    with pytest.raises(errors.MalformedReport, match="not a redisync meta key"):
        parse_publish(reply, [])
    assert store.redis.exists("some:other:key") == 0


def test_what_a_fold_found_well_formed_vouches_for_nothing_else(run):
    """The fold remembers, per Lua VM, the shard ids, incarnations and key pairs it found right: a
    string right in one place is still checked in another, and a pair's halves are never mixed."""
    store, _ = run
    k = store.keys
    # "0" is a shard id (folded here) and never an incarnation; "12345678901" an incarnation, never a shard id
    store.shard(0, incarnation=12345678901).publish({"curriculum/scale": {"value": 1.0}})
    before = state_bytes(store)
    for kwargs in (dict(inc="0"), dict(shard="12345678901")):
        with pytest.raises(errors.MalformedReport):
            parse_publish(forge(store, **kwargs), [])
    bins, norm = "motion/bin_failed", "obs/norm"
    for pair in ((k.key_meta(bins), k.key_data(norm)), (k.key_meta(norm), k.key_data(bins))):
        with pytest.raises(errors.MalformedReport, match="KEYS do not match"):
            parse_publish(forge(store, keys=[k.meta, k.shards, k.reports, k.dead_letters, *pair]), [])
    # another run's keys, named under this run's meta key (the run's names were remembered at its first fold)
    other = [k.meta, "redisync:{other}:shards", k.reports, k.dead_letters, k.key_meta(bins), k.key_data(bins)]
    with pytest.raises(errors.MalformedReport, match="KEYS"):
        parse_publish(forge(store, keys=other), [])
    assert state_bytes(store) == before


def test_the_fold_reads_a_keys_declaration_from_one_field_as_registered(run):
    """register.lua writes each key's declaration (``SpecBase.declared``) in one field; the fold
    trusts it, parses a text once per Lua VM and reads a changed one anew: malformed, or not a merge
    key's, it refuses the report and writes nothing; a run registered before the field existed folds
    from the fields one by one."""
    store, shard = run
    for name, spec in SCHEMA.keys.items():
        assert store.key_info(name)["declared"] == spec.declared()
    assert SCHEMA.keys["obs/norm"].declared() == "5|1|2||3600.0|history|"  # (retire_after_s: its grace)
    assert SCHEMA.keys["curriculum/scale"].declared() == "1|0|1||||0"
    bins = store.keys.key_meta("motion/bin_failed")
    good = {"motion/bin_failed": {"count": 1, "sum": [0.5, 0.25, 0.0, 1.0]}}
    version = store.key_info("motion/bin_failed")["version"]
    data = state_bytes(store)["data:motion/bin_failed"]
    for text, error, detail in (
        ("5|1|4|x|||", errors.CorruptState, "is not width|count_size"),
        ("5|0|4||||", errors.CorruptState, "not a merge key's"),
        ("5|1|3||||", errors.CorruptState, "not a merge key's"),
        ("9|1|8||||", errors.ShapeMismatch, "payload is 40 bytes, the key needs 72"),
    ):
        store.redis.hset(bins, "declared", text)
        with pytest.raises(error, match=re.escape(detail)):
            shard.publish(good)
        assert store.key_info("motion/bin_failed")["version"] == version
        assert state_bytes(store)["data:motion/bin_failed"] == data
    store.redis.hset(bins, "declared", "5|1|4||||")  # the same key, without its lifecycle: still a merge key
    shard.publish(good)
    assert list(store.fleet().keys["motion/bin_failed"].parts()["sum"]) == [0.5, 0.25, 0.0, 1.0]
    store.redis.hdel(bins, "declared")  # as a run registered before the field existed
    shard.publish({"motion/bin_failed": {"count": 2, "sum": [1.0, 1.0, 1.0, 1.0]}})
    parts = store.fleet().keys["motion/bin_failed"].parts()
    assert parts["count"] == 2.0
    assert list(parts["sum"]) == [1.0, 1.0, 1.0, 1.0]


def test_the_fold_reads_the_runs_limits_from_one_field_as_registered(run):
    """The run's limits are one meta field (``Limits.packed``) the fold parses once per Lua VM and
    reads anew when changed; a run registered before the field existed folds with the fields one by
    one; a snapshot without it is restored with it, made from the fields beside it."""
    store, shard = run
    meta = store.keys.meta
    assert store.run_info()["limits"] == Limits(max_report_bytes=1000).packed() == "1000|1000|0|10000|67108864|2000000"
    good = {"motion/bin_failed": {"count": 1, "sum": [0.5, 0.25, 0.0, 1.0]}}
    store.redis.hset(meta, "limits", Limits(max_report_bytes=39).packed())
    with pytest.raises(errors.PayloadTooLarge, match="exceeds max_report_bytes=39"):
        shard.publish(good)
    store.redis.hset(meta, "limits", Limits(max_report_bytes=40, stream_maxlen=3, stream_payloads=True).packed())
    shard.publish(good)
    newest = store.redis.xrevrange(store.keys.reports, count=1)[0][1]
    assert newest[b"report:motion/bin_failed"] == encode([np.ones(1), np.array([0.5, 0.25, 0.0, 1.0])])
    snap = store.snapshot()
    store.redis.hdel(meta, "limits")  # as a run registered before the field existed: max_report_bytes 1000
    shard.publish(good)
    assert store.redis.xrevrange(store.keys.reports, count=1)[0][1][b"report:motion/bin_failed"] == b"40 bytes"
    store.redis.hset(meta, "max_report_bytes", 39)
    with pytest.raises(errors.PayloadTooLarge, match="exceeds max_report_bytes=39"):
        shard.publish(good)
    del snap.hashes["meta"]["limits"]
    store.restore(snap)
    assert store.run_info()["limits"] == "1000|1000|0|10000|67108864|2000000"  # from the snapshot's own fields
