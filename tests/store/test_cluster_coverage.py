"""A Cluster with a slot no node serves: the runs in other slots connect and work; the run in that slot
fails alone with a typed error (redis-py's default client refuses every new connection, for every run)."""

from __future__ import annotations

import pytest
import redis

import redisync
from redisync import errors
from redisync.store.schema import Schema, merge

from ..servers import LoopbackCluster

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

SCHEMA = Schema.of({"obs/norm": merge(2, lifecycle="history")})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    loopback = LoopbackCluster(tmp_path_factory.mktemp("coverage"), primaries=3).start()
    yield loopback
    loopback.stop()


def test_an_uncovered_slot_fails_only_its_runs_with_a_typed_error(cluster):
    """Every node forgets one slot (CLUSTER DELSLOTS): a store of a run elsewhere connects, registers,
    folds and pulls; a store of the run in that slot raises ConnectionUnavailable naming the run, on
    its first call and on a client made before the slot was lost."""
    lost, kept = "uncovered-run", "covered-run"
    slot = redis.cluster.key_slot(f"redisync:{{{lost}}}:meta".encode())
    assert slot != redis.cluster.key_slot(f"redisync:{{{kept}}}:meta".encode())
    before = redisync.connect(cluster.url, run=lost)
    before.register(SCHEMA)
    for node in cluster.nodes:
        cluster.client(node).execute_command("CLUSTER", "DELSLOTS", slot)
    try:
        store = redisync.connect(cluster.url, run=kept)  # redis-py's default: "All slots are not covered"
        store.register(SCHEMA)
        assert store.shard(0).publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}}).applied
        assert store.fleet().keys["obs/norm"].parts()["count"] == 2
        with pytest.raises(errors.ConnectionUnavailable, match=lost):
            redisync.connect(cluster.url, run=lost).register(SCHEMA)
        with pytest.raises(errors.ConnectionUnavailable, match=lost):
            before.fleet()
        store.delete()
    finally:
        owner = cluster.nodes[0]
        cluster.client(owner).execute_command("CLUSTER", "ADDSLOTS", slot)
