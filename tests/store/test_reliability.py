"""Faults on a real server: lost replies and retries; a restart from the append-only file."""

from __future__ import annotations

import time

import numpy as np
import pytest

import redisync
from redisync import errors
from redisync.store.codec import encode
from redisync.store.schema import Schema, broadcast, merge

from ..faults import ReplyDroppingProxy
from ..reference import ReferenceFold
from ..servers import RedisProcess
from ..support import assert_same_state, envelope, lua_state, reference_state, send_as

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)
from .test_fold_properties import random_operations

# no stale keys: the reference fold cannot know the server time of a fold whose reply was lost
SCHEMA = Schema.of(
    {
        "motion/ema": merge(3, lifecycle="history"),
        "obs/norm": merge(2, sumsq=True, lifecycle="history"),
        "curriculum/stage": broadcast(2),
        "curriculum/scale": broadcast((), owner=0),
    }
)


def test_lost_replies_are_retried_and_folded_once(tmp_path):
    """Replies lost on the way back are retried by the client and each report is folded once."""
    server = RedisProcess(tmp_path).start()
    proxy = ReplyDroppingProxy(server.port, p=0.05, seed=1)
    store = redisync.connect(proxy.url, run="lost-replies")
    try:
        store.register(SCHEMA)
        ref = ReferenceFold(SCHEMA)
        clients = {s: store.shard(s, incarnation=1000 + s) for s in range(3)}
        last: dict[int, tuple[int, dict]] = {}
        outcomes = {"applied": 0, "duplicate": 0, "rejected": 0, "gave_up_and_resent": 0}
        reasons: dict[str, int] = {}
        ops = [op for op in random_operations(7, 10_700, names=list(SCHEMA.keys), shards=3) if op[0] != "sleep"]
        assert len(ops) >= 10_000
        for _, shard, payloads in ops:  # the owned key from its owner only: other refusals are tested elsewhere
            if shard != 0 and len(payloads) > 1:
                payloads.pop("curriculum/scale", None)
        for kind, shard, payloads in ops:
            c = clients[shard]
            inc, seq, payloads = envelope(kind, c, last, shard, payloads)
            encoded = {n: encode([p]) for n, p in payloads.items()}
            while True:  # the application's retry on top of redis-py's: the same seq, until an answer
                try:
                    res = send_as(c, inc, encoded, seq)
                    got, now = (res.status, None, None), res.server_time_us or 0
                    break
                except errors.InvalidReport as e:
                    got, now = ("rejected", e.reason, e.key), 0
                    break
                except errors.ConnectionUnavailable:
                    outcomes["gave_up_and_resent"] += 1
            outcomes[got[0]] += 1
            if got[1]:
                reasons[got[1]] = reasons.get(got[1], 0) + 1
            if got[0] == "applied":
                c.seq = max(c.seq, seq)
                last[shard] = (seq, payloads)
            expected = ref.apply(shard, inc, seq, payloads, now)
            if got[0] == "duplicate" and expected.status == "applied":
                # the first try was folded but its reply was lost: the retry is the duplicate
                c.seq = max(c.seq, seq)
                last[shard] = (seq, payloads)
                got = ("applied", None, None)
            assert got == (expected.status, expected.reason, expected.key), (kind, shard)
        assert proxy.dropped > 100
        assert outcomes["duplicate"] > 100
        assert_same_state(lua_state(store), reference_state(ref))
        print(f"\n{len(ops)} publishes, {proxy.dropped} replies dropped: {outcomes}, rejections {reasons}")
    finally:
        proxy.close()
        server.kill()


def test_restart_from_the_append_only_file_keeps_state_and_versions(tmp_path):
    """deploy/redis.conf (fsync every second): SIGKILL a second after the last fold, all of it comes back,
    and the first fold on the new process opens a new epoch."""
    from pathlib import Path

    conf = Path(__file__).resolve().parents[2] / "deploy" / "redis.conf"
    server = RedisProcess(tmp_path, conf=conf).start()
    store = redisync.connect(server.url, run="aof")
    schema = Schema.of({"obs/norm": merge(2, lifecycle="history"), "curriculum/scale": broadcast(())})
    store.register(schema)
    shard = store.shard(0)
    for i in range(50):
        shard.publish({"obs/norm": {"count": i + 1, "sum": [i, 2 * i]}, "curriculum/scale": {"value": i / 10}})
    seen = shard.pull()
    time.sleep(1.5)  # appendfsync everysec: what is older than a second is on disk
    server.kill()
    server.start()
    try:
        shard.store.redis.connection_pool.disconnect()
        after = shard.pull()
        assert after is None  # same epoch, same fleet version: nothing changed for this client
        fleet = store.fleet()
        assert fleet.epoch == seen.epoch
        assert fleet.fleet_version == seen.fleet_version == 50
        np.testing.assert_array_equal(fleet.keys["obs/norm"].value, seen.keys["obs/norm"].value)
        # the first fold on the new server process opens a new epoch: the server cannot know whether
        # the tail of its file was lost, so every client re-takes the whole state and re-publishes
        result = shard.publish({"obs/norm": {"count": 60, "sum": [0, 0]}})
        assert result.fleet_version == 51
        assert result.epoch != seen.epoch
        assert shard.pull().epoch_changed
    finally:
        server.kill()


def test_versions_never_go_backwards_for_a_client_when_writes_are_lost(make_store):
    """A restart that loses the last second of folds (AOF everysec) must not move a client's versions back."""
    store = make_store()
    store.register(SCHEMA)
    a, b = store.shard(0), store.shard(1)
    for i in range(5):
        a.publish({"motion/ema": {"count": 1, "sum": [i, i, i]}})
    seen = b.pull().fleet_version
    assert seen == 5
    store.redis.hset(store.keys.meta, "fleet_version", 2)  # what a crash between two fsyncs leaves behind
    regressed = b.pull()
    assert regressed.lost_writes
    assert regressed.fleet_version == 2
    result = b.publish({"motion/ema": {"count": 1, "sum": [9, 9, 9]}})
    assert result.fleet_version > seen  # the fold continues above what this client had seen
    assert b.pull().fleet_version == result.fleet_version
    assert not b.known.lost_writes
