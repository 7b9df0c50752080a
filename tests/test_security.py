"""deploy/users.acl against a real server: each role does its job and is refused outside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

import redisync
from redisync import errors
from redisync.store.schema import Schema, broadcast, merge

from .servers import RedisProcess

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

ACL = Path(__file__).resolve().parents[1] / "deploy" / "users.acl"
RUN = "humanoid-v3"
SCHEMA = Schema.of({"obs/norm": merge(2, lifecycle="history"), "curriculum/scale": broadcast(())})


@pytest.fixture
def acl_server(tmp_path):
    server = RedisProcess(tmp_path, None, "--aclfile", str(ACL)).start_authenticated("learner", "learner-change-me")
    yield server
    server.kill()


def url(server, user: str) -> str:
    return f"redis://{user}:{user}-change-me@127.0.0.1:{server.port}/0"


def test_collector_publishes_and_pulls_its_run_only(acl_server):
    store = redisync.connect(url(acl_server, "collector"), run=RUN)
    store.register(SCHEMA)
    shard = store.shard(0)
    assert shard.publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}}).applied
    assert shard.pull().fleet_version == 1
    sub = store.redis.pubsub()
    sub.subscribe(store.keys.channel)  # its run's channel: allowed
    other = redisync.connect(url(acl_server, "collector"), run="other-run")
    with pytest.raises(errors.PermissionDenied, match="other-run"):
        other.register(SCHEMA)
    with pytest.raises(errors.PermissionDenied):
        store.snapshot()  # checkpoints are the learner's
    with pytest.raises(redis.exceptions.NoPermissionError):
        store.redis.flushall()
    foreign = store.redis.pubsub()
    foreign.subscribe("redisync:{other-run}:versions")
    with pytest.raises(redis.exceptions.NoPermissionError):
        foreign.get_message(timeout=2)


def test_learner_snapshots_and_restores(acl_server):
    collector = redisync.connect(url(acl_server, "collector"), run=RUN)
    collector.register(SCHEMA)
    collector.shard(0).publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}})
    learner = redisync.connect(url(acl_server, "learner"), run=RUN)
    learner.shard(0).publish({"curriculum/scale": {"value": 0.5}})  # a broadcast decision
    snap = learner.snapshot()
    learner.restore(snap)
    np.testing.assert_array_equal(learner.fleet().keys["obs/norm"].parts()["sum"], [1.0, 2.0])
    with pytest.raises(errors.PermissionDenied):
        redisync.connect(url(acl_server, "learner"), run="other-run").snapshot()


def test_inspector_reads_but_never_writes(acl_server):
    redisync.connect(url(acl_server, "collector"), run=RUN).register(SCHEMA)
    inspector = redisync.connect(url(acl_server, "inspector"), run=RUN)
    assert inspector.run_info()["fleet_version"] == "0"
    assert inspector.key_info("obs/norm")["semantics"] == "merge"
    with pytest.raises(errors.PermissionDenied):
        inspector.shard(0).publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    with pytest.raises(redis.exceptions.NoPermissionError):
        inspector.redis.hset(inspector.keys.meta, "fleet_version", 99)
    with pytest.raises(redis.exceptions.NoPermissionError):
        inspector.redis.hgetall("redisync:{other-run}:meta")


def test_anonymous_and_wrong_passwords_are_refused(acl_server):
    with pytest.raises(errors.PermissionDenied):
        redisync.connect(f"redis://127.0.0.1:{acl_server.port}/0", run=RUN).run_info()
    with pytest.raises(errors.PermissionDenied):
        redisync.connect(f"redis://collector:wrong@127.0.0.1:{acl_server.port}/0", run=RUN).run_info()


def test_a_role_that_may_not_run_info_is_refused_at_register_with_the_permission_named(tmp_path):
    """Without INFO the folds cannot see a server restart that lost writes, and (epoch, version)
    would name two states: refused, typed, instead of silently off."""
    acl = tmp_path / "users.acl"
    lines = ACL.read_text().splitlines()
    collector = next(line for line in lines if line.startswith("user collector "))
    acl.write_text(
        "\n".join(
            [
                *lines,
                collector.replace("user collector ", "user noinfo ")
                .replace(">collector-change-me", ">noinfo-change-me")
                .replace(" +info", ""),
            ]
        )
        + "\n"
    )
    server = RedisProcess(tmp_path, None, "--aclfile", str(acl)).start_authenticated("learner", "learner-change-me")
    try:
        store = redisync.connect(url(server, "noinfo"), run=RUN)
        with pytest.raises(errors.PermissionDenied, match=r"may not run INFO.*grant \+info"):
            store.register(SCHEMA)
        assert redisync.connect(url(server, "learner"), run=RUN).redis.hgetall(f"redisync:{{{RUN}}}:meta") == {}
        redisync.connect(url(server, "collector"), run=RUN).register(SCHEMA)  # the deployed role may
    finally:
        server.kill()
