"""The store's behaviour through the public client, on the embedded default and a real Redis."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest

import redisync
from redisync import errors
from redisync.inspection import describe_run
from redisync.store import codec
from redisync.store.client import RunSnapshot
from redisync.store.schema import Limits, Schema, broadcast, merge

SCHEMA = Schema.of(
    {
        "motion/bin_failed": merge(4, lifecycle="history"),
        "obs/norm": merge(2, sumsq=True, lifecycle="history"),
        "curriculum/scale": broadcast((), owner=0),
        "curriculum/stage": broadcast(1),
    }
)


def ema(shard: int, k: float = 1.0) -> dict:
    return {"count": 1, "sum": k * (np.arange(4.0) + shard)}


def test_first_registration_wins_and_a_different_schema_is_refused(make_store):
    """The first registration wins: registering the same schema again finds the run and its epoch, another
    schema is refused naming the key and how it differs."""
    store = make_store()
    first = store.register(SCHEMA)
    assert first.created
    again = redisync.store.client.Store(store.redis, store.run).register(SCHEMA)
    assert not again.created
    assert again.epoch == first.epoch
    other = Schema.of({**SCHEMA.keys, "obs/norm": merge(3, sumsq=True, lifecycle="history")})
    with pytest.raises(errors.SchemaMismatch) as info:
        redisync.store.client.Store(store.redis, store.run).register(other)
    assert info.value.key == "obs/norm"
    assert "shape=(3,) here, (2,) registered" in str(info.value)


def test_a_retried_report_is_folded_once(make_store):
    """A report sent again with the same sequence number is a duplicate: folded once, the fleet version
    unchanged."""
    store = make_store()
    store.register(SCHEMA)
    a = store.shard(0)
    payloads = {"motion/bin_failed": redisync.store.codec.encode([np.ones(1), np.full(4, 2.0)])}
    assert a.publish_payloads(payloads, seq=1).status == "applied"
    dup = a.publish_payloads(payloads, seq=1)
    assert dup.status == "duplicate"
    assert dup.fleet_version == 1
    assert store.fleet().keys["motion/bin_failed"].parts()["count"] == 1


def test_restarted_shard_retires_history_and_drops_state_slots(make_store):
    """A new incarnation of a shard keeps its previous life's history counted (retired) and drops its previous
    life's state slot."""
    store = make_store()
    schema = Schema.of(
        {"obs/norm": merge(1, lifecycle="history"), "motion/ema": merge(1, stale_after_s=0.5, lifecycle="state")}
    )
    store.register(schema)
    old = store.shard(0, incarnation=10)
    old.publish({"obs/norm": {"count": 5, "sum": 10}, "motion/ema": {"count": 1, "sum": 3}})
    new = store.shard(0, incarnation=11)
    new.publish({"obs/norm": {"count": 1, "sum": 1}, "motion/ema": {"count": 1, "sum": 4}})
    fleet = store.fleet().keys
    assert fleet["obs/norm"].parts()["count"] == 6  # history kept: retired 5 + new 1
    assert fleet["motion/ema"].parts()["sum"][0] == 4  # the dead life's EMA stopped weighting the fleet
    described = {k["key"]: k for k in describe_run(store)["keys"]}
    assert described["obs/norm"]["retired_count"] == 5
    assert described["obs/norm"]["count"] == 6
    with pytest.raises(errors.StaleIncarnation):  # the old process is a zombie now
        old.publish({"obs/norm": {"count": 9, "sum": 9}})

    other = store.shard(1)
    other.publish({"motion/ema": {"count": 1, "sum": 100}})
    time.sleep(0.6)  # (stale_after_s 0.5: on a loaded machine a shorter one let shard 0's slot go stale too)
    new.publish({"motion/ema": {"count": 1, "sum": 5}})  # shard 1 went silent: its slot drops out
    assert store.fleet().keys["motion/ema"].parts()["sum"][0] == 5
    info = store.key_info("motion/ema")
    assert info["writers"] == "0"
    assert info["dropped_stale"] == "1"


def test_redis_cli_sees_readable_metadata_streams_and_announcements(make_store):
    """An operator with redis-cli reads a key's metadata as plain fields, the accepted reports in a stream,
    and each fold's announcement on the run's shard channel."""
    store = make_store()
    store.register(SCHEMA)
    sub = store.redis.pubsub()
    sub.ssubscribe(store.keys.channel)  # the run's shard channel (SPUBLISH)
    assert sub.get_message(timeout=1)["type"] == "ssubscribe"
    a = store.shard(3)
    a.publish({"motion/bin_failed": {"count": 2, "sum": 1}})
    info = store.key_info("motion/bin_failed")
    for field in (
        "semantics",
        "shape",
        "version",
        "writers",
        "updated_at_us",
        "slot:3:seq",
        "count_size",
    ):
        assert field in info
    assert (info["semantics"], info["shape"], info["version"], info["writers"]) == ("merge", "4", "1", "3")
    described = {k["key"]: k for k in describe_run(store)["keys"]}["motion/bin_failed"]  # counts: off the vectors
    assert described["count"] == 2
    assert [s["count"] for s in described["slots"]] == [2]
    run = store.run_info()
    assert run["fleet_version"] == "1"
    assert json.loads(run["schema"])["keys"]["obs/norm"]["sumsq"] is True
    entries = store.redis.xrange(store.keys.reports)
    assert len(entries) == 1
    assert entries[0][1][b"shard"] == b"3"
    assert entries[0][1][b"fleet_version"] == b"1"
    msg = sub.get_message(timeout=1)
    assert msg
    assert msg["type"] == "smessage"
    assert msg["data"] == b"1 " + store.fleet().epoch.encode()  # '<fleet_version> <epoch>'
    sub.close()


def test_streams_are_capped(make_store):
    """The reports stream stays near its cap (MAXLEN ~), however many folds."""
    store = make_store()
    store.register(SCHEMA, Limits(stream_maxlen=10))
    a = store.shard(0)
    for i in range(300):
        a.publish({"curriculum/stage": {"value": [float(i)]}})
    # MAXLEN ~ trims whole macro nodes: the stream stays near the cap, far below 300
    assert store.redis.xlen(store.keys.reports) < 150


def test_snapshot_and_restore_round_trip_through_json(make_store):
    """A snapshot survives JSON and restores into another run under a new epoch, above every version that run
    had served, with the snapshot's state."""
    src, dst = make_store(), make_store()
    src.register(SCHEMA)
    a = src.shard(0)
    a.publish({"motion/bin_failed": ema(0), "obs/norm": {"count": 3, "sum": [1, 2], "sumsq": [1, 4]}})
    a.publish({"curriculum/stage": {"value": [4.0]}})
    snap = RunSnapshot.model_validate_json(src.snapshot().model_dump_json())
    dst.register(SCHEMA)
    d = dst.shard(0)
    for _ in range(5):
        d.publish({"curriculum/stage": {"value": [9.0]}})
    before = d.pull()
    epoch = dst.restore(snap)
    after = d.pull()
    assert after.epoch == epoch
    assert after.epoch_changed
    assert after.fleet_version > before.fleet_version  # versions never go backwards
    want, got = src.fleet().keys, after.keys
    for name in SCHEMA.keys:
        np.testing.assert_array_equal(got[name].value, want[name].value)
    assert got["curriculum/stage"].version > before.keys["curriculum/stage"].version


def test_restore_refuses_corrupt_snapshots(make_store):
    """A snapshot with a field that is not base64 is refused as corrupt."""
    store = make_store()
    store.register(SCHEMA)
    snap = store.snapshot()
    bad = snap.model_copy(update={"hashes": {**snap.hashes, "meta": {**snap.hashes["meta"], "schema": "!!notbase64"}}})
    with pytest.raises(errors.CorruptSnapshot, match="not base64"):
        store.restore(bad)


def test_a_lost_run_is_reported_and_a_new_epoch_seen(make_store):
    """A run the store lost is RunNotFound for pulls and publishes; registered again, it is seen under a new
    epoch."""
    store = make_store()
    store.register(SCHEMA)
    a = store.shard(0)
    first = a.pull()
    store.delete()
    with pytest.raises(errors.RunNotFound):
        a.pull()
    with pytest.raises(errors.RunNotFound):
        a.publish({"curriculum/stage": {"value": [1.0]}})
    store.register(SCHEMA)
    again = a.pull()
    assert again.epoch != first.epoch
    assert again.epoch_changed


def test_connect_reads_the_url_from_the_environment(monkeypatch, real_url):
    """connect() without a URL takes REDISYNC_URL, and without it the embedded store."""
    monkeypatch.setenv("REDISYNC_URL", real_url)
    store = redisync.connect(run="env-check")
    assert store.url == real_url
    assert store.redis.ping()
    monkeypatch.delenv("REDISYNC_URL")
    assert redisync.connect(run="env-check").url == "embedded"


def test_bad_urls_fail_clearly():
    """An unsupported URL scheme, and a server that does not answer, are ConnectionUnavailable naming the URL."""
    with pytest.raises(errors.ConnectionUnavailable, match="unsupported URL"):
        redisync.connect("http://example.org", run="x")
    store = redisync.connect("redis://127.0.0.1:1", run="x", socket_connect_timeout=0.2)
    with pytest.raises(errors.ConnectionUnavailable, match=re.escape("127.0.0.1:1")):
        store.register(SCHEMA)


def test_the_reports_stream_keeps_payloads_only_when_the_run_asks(make_store):
    """The reports stream keeps each report's envelope, and its payloads only for a run registered with
    stream_payloads."""
    plain, audited = make_store(), make_store()
    plain.register({"obs/n": merge(2, lifecycle="history")})
    audited.register({"obs/n": merge(2, lifecycle="history")}, Limits(stream_payloads=True))
    report = {"obs/n": {"count": 1.0, "sum": [1.0, 2.0]}}
    for store in (plain, audited):
        store.shard(0).publish(report)
    envelope = plain.redis.xrange(plain.keys.reports)[-1][1]
    assert envelope[b"report:obs/n"] == b"24 bytes"
    assert envelope[b"shard"] == b"0"
    kept = audited.redis.xrange(audited.keys.reports)[-1][1][b"report:obs/n"]
    assert np.frombuffer(kept, "<f8").tolist() == [1.0, 1.0, 2.0]
    assert audited.limits().stream_payloads
    assert not plain.limits().stream_payloads


@pytest.mark.parametrize("field", ["agg", "agg_lo"])
def test_restore_refuses_a_snapshot_whose_sums_disagree_with_its_slots(make_store, field):
    """The folds trust the stored exact sum (each adds what changed): a snapshot whose sum is not
    what its slots sum to would poison every later fold; one left out is re-made from the slots."""
    import base64

    store = make_store()
    store.register(SCHEMA)
    shards = {shard: store.shard(shard) for shard in (0, 1, 5, 17)}
    for client in shards.values():
        client.publish({"obs/norm": {"count": 3, "sum": [1, 2], "sumsq": [1, 4]}})
    snap = store.snapshot()
    data = dict(snap.hashes["data:obs/norm"])
    tampered = codec.decode(base64.b64decode(data[field]))
    tampered[0] += 1000.0
    data[field] = base64.b64encode(codec.encode([tampered])).decode()
    bad = snap.model_copy(update={"hashes": {**snap.hashes, "data:obs/norm": data}})
    before = store.fleet().keys["obs/norm"].value.copy()
    with pytest.raises(errors.CorruptSnapshot, match="not the exact sum"):
        store.restore(bad)
    np.testing.assert_array_equal(store.fleet().keys["obs/norm"].value, before)  # nothing written
    missing = snap.model_copy(
        update={
            "hashes": {
                **snap.hashes,
                "data:obs/norm": {k: v for k, v in snap.hashes["data:obs/norm"].items() if k != field},
            }
        }
    )
    store.restore(missing)  # re-made from the slots
    shards[0].publish({"obs/norm": {"count": 4, "sum": [1, 2], "sumsq": [1, 4]}})
    assert float(store.fleet().keys["obs/norm"].parts()["count"]) == 4 + 3 + 3 + 3
    assert_matches_reference(store, {0: [4, 1, 2, 1, 4], 1: [3, 1, 2, 1, 4], 5: [3, 1, 2, 1, 4], 17: [3, 1, 2, 1, 4]})


def assert_matches_reference(store, slots: dict[int, list[float]]) -> None:
    """The stored exact sum of obs/norm is, bit for bit, the reference's for ``slots`` (its canonical
    planes), and no other field is left beside the slots."""
    from redisync.store.semantics import merge as semantics

    data = {k.decode(): v for k, v in store.redis.hgetall(store.keys.key_data("obs/norm")).items()}
    payloads = [np.array(v, dtype=np.float64) for v in slots.values()]
    assert sorted(f for f in data if not f.startswith("slot:")) == ["agg", "agg_lo"]  # every stale field gone
    planes = semantics.exact_planes(payloads, 5)
    assert semantics.planes_of(data["agg"], data["agg_lo"], 5).tobytes() == planes.tobytes()
    assert store.redis.hget(store.keys.key_meta("obs/norm"), "sums_layout") == semantics.LAYOUT.encode()


def test_a_closed_store_holds_no_connection_and_opens_one_when_used_again(real_url):
    """A store's connections were left to the garbage collector (a warning per socket in a long
    tool or test run): `close()`, or leaving a ``with`` block, closes them at once, and a later call
    connects again."""
    name = f"t-close-{time.monotonic_ns()}"
    watcher = redisync.connect(real_url, run="watcher")

    def open_connections() -> int:
        return sum(1 for c in watcher.redis.client_list() if c.get("name") == name)

    with redisync.connect(real_url, run=name, client_name=name) as store:
        store.register(SCHEMA)
        store.shard(0).publish({"motion/bin_failed": ema(0)})
        assert open_connections() >= 1
    assert open_connections() == 0
    assert store.fleet().fleet_version == 1  # used again: a new connection
    assert open_connections() == 1
    store.delete()
    store.close()
    assert open_connections() == 0
    watcher.close()
