"""Redis Cluster: three primaries started here; a run lives in one slot, runs do not interfere."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import redis

import redisync
from redisync.store.schema import Schema, broadcast, merge

from ..servers import LoopbackCluster, RedisProcess

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

SCHEMA = Schema.of({"obs/norm": merge(3, sumsq=True, lifecycle="history"), "curriculum/scale": broadcast(())})


NODES: list[RedisProcess] = []  # the module's cluster, for the tests that pause a node


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    loopback = LoopbackCluster(tmp_path_factory.mktemp("cluster"), primaries=3).start()
    NODES[:] = loopback.nodes
    yield loopback.url
    loopback.stop()


def two_runs_on_different_nodes(client) -> tuple[str, str]:
    """Two run names whose hash tags map to slots served by different primaries."""
    owner = {}
    for i in range(100):
        name = f"cluster-run-{i}"
        node = client.get_node_from_key(f"redisync:{{{name}}}:meta")
        owner.setdefault(node.name, name)
        if len(owner) >= 2:
            a, b = list(owner.values())[:2]
            return a, b
    pytest.fail("could not find two runs on different nodes")


def test_runs_live_in_one_slot_and_do_not_interfere(cluster):
    """On a Cluster each run lives in one slot, and two runs on different nodes fold and pull without touching
    each other."""
    probe = redisync.connect(cluster, run="probe")
    a_name, b_name = two_runs_on_different_nodes(probe.redis)
    a, b = redisync.connect(cluster, run=a_name), redisync.connect(cluster, run=b_name)
    try:
        for store, k in ((a, 1.0), (b, 10.0)):
            store.register(SCHEMA)
            shard = store.shard(0)
            shard.publish(
                {
                    "obs/norm": {"count": 2, "sum": np.full(3, k), "sumsq": np.full(3, k * k)},
                    "curriculum/scale": {"value": k},
                }
            )
            assert shard.pull().fleet_version == 1
        slots = {
            redis.cluster.key_slot(k.encode()) for k in [a.keys.meta, a.keys.key_data("obs/norm"), a.keys.dead_letters]
        }
        assert len(slots) == 1  # the hash tag keeps the run in one slot
        assert float(a.fleet().keys["curriculum/scale"].parts()["value"]) == 1.0
        assert float(b.fleet().keys["curriculum/scale"].parts()["value"]) == 10.0
        # announcements on the run's shard channel, and a snapshot/restore round trip through the cluster client
        sub = a.redis.pubsub()
        sub.ssubscribe(a.keys.channel)
        a.shard(1).publish({"obs/norm": {"count": 1, "sum": np.ones(3), "sumsq": np.ones(3)}})
        deadline, seen = time.monotonic() + 5, None
        while seen is None and time.monotonic() < deadline:
            msg = sub.get_sharded_message(timeout=0.5)
            seen = msg["data"] if msg and msg["type"] == "smessage" else None
        assert seen == b"2 " + a.fleet().epoch.encode()  # '<fleet_version> <epoch>'
        snap = a.snapshot()
        a.restore(snap)
        np.testing.assert_array_equal(a.fleet().keys["obs/norm"].parts()["count"], 3)
        assert b.fleet().fleet_version == 1  # the other run saw none of it
        # the CLI, through the same cluster URL
        out = subprocess.run(
            [sys.executable, "-m", "redisync.cli", "inspect", "--url", cluster, "--run", a_name, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)[0]["fleet_version"] == 3
    finally:
        a.delete()
        b.delete()


def test_a_run_never_waits_on_an_unrelated_node(cluster):
    """The client's default node paused (SIGSTOP: a stalled VM, a fork): a run whose slot another
    primary serves publishes and pulls on, every call answered. redis-py asked the default node for each
    FCALL's keys first (COMMAND GETKEYS), so every call of every run waited on that node."""
    store = redisync.connect(cluster, run="probe", socket_timeout=2.0, socket_connect_timeout=2.0)
    default = store.redis.get_default_node()
    run = next(
        name
        for name in (f"cluster-detour-{i}" for i in range(200))
        if store.redis.get_node_from_key(f"redisync:{{{name}}}:meta").name != default.name
    )
    store = redisync.connect(cluster, run=run, socket_timeout=2.0, socket_connect_timeout=2.0)
    store.redis.set_default_node(default)
    paused = next(n for n in NODES if default.name.endswith(f":{n.port}"))
    try:
        store.register(SCHEMA)
        shard = store.shard(0)
        report = {"obs/norm": {"count": 1, "sum": np.ones(3), "sumsq": np.ones(3)}}
        shard.publish(report)  # (the library loaded on every primary, the shard claimed)
        os.kill(paused.proc.pid, signal.SIGSTOP)
        try:
            for _ in range(5):
                assert shard.publish(report).status == "applied"
            assert shard.pull() is not None
            assert store.fleet().fleet_version == 6
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
    finally:
        store.delete()


def test_wait_replicas_is_refused_with_a_cluster_url(cluster):
    """WAIT would go to another node than the run's primary and acknowledge nothing it waited for (a
    publish returned 'applied' with the run's replica paused): refused at connect(), saying why."""
    with pytest.raises(redisync.errors.ConfigurationError, match="wait_replicas=1 with a Cluster URL"):
        redisync.connect("redis+cluster://127.0.0.1:7000", run="r", wait_replicas=1)
    assert redisync.connect(cluster, run="r").wait_replicas == 0


@pytest.mark.parametrize(
    "failure",
    [
        redis.exceptions.ClusterDownError("The cluster is down"),
        redis.exceptions.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.SlotNotCoveredError("Slot 1234 is not covered by the cluster."),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_cluster_partly_down_is_store_unavailable(cluster, failure, monkeypatch):
    """While a primary fails over, the Cluster answers CLUSTERDOWN, TRYAGAIN or MOVED storms: a
    collector's worker must read that as the store being unavailable (typed, retried), not an untyped
    worker error."""
    store = redisync.connect(cluster, run="partly-down")

    def down(*args, **kwargs):
        raise failure

    monkeypatch.setattr(store.redis, "hget", down)
    monkeypatch.setattr(store.redis, "execute_command", down)
    with pytest.raises(redisync.errors.ConnectionUnavailable, match="cannot serve run 'partly-down'"):
        store.registered()
    with pytest.raises(redisync.errors.ConnectionUnavailable):
        store.shard(0).pull()


def test_announcements_stay_on_the_runs_shard(cluster):
    """A fold announces on the run's shard channel (SPUBLISH): no message crosses the cluster bus to
    the other primaries (a PUBLISH goes to every node, so announcement traffic grew with the cluster)."""
    store = redisync.connect(cluster, run="cluster-announce")
    node = store.redis.get_node_from_key(store.keys.meta)
    primary = next(n for n in NODES if node.name.endswith(f":{n.port}"))
    bus = redis.Redis(port=primary.port, decode_responses=True)
    try:
        store.register(SCHEMA)
        shard = store.shard(0)
        sent = int(bus.cluster("info").get("cluster_stats_messages_publish_sent", 0))
        for i in range(20):
            shard.publish({"obs/norm": {"count": i + 1, "sum": np.ones(3), "sumsq": np.ones(3)}})
        assert store.fleet().fleet_version == 20
        assert int(bus.cluster("info").get("cluster_stats_messages_publish_sent", 0)) == sent
    finally:
        store.delete()
