"""Any number of redisync versions on one server: each version's functions load beside the others',
with deploy/users.acl's roles, and a live fleet upgrades one collector at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import redisync
from redisync.store.library import Library

from ..servers import RedisProcess

pytestmark = pytest.mark.integration  # starts a redis-server of its own

ACL = Path(__file__).resolve().parents[2] / "deploy" / "users.acl"
RUN = "humanoid-v3"
SCHEMA = {"obs/norm": redisync.merge(2, lifecycle="history")}
LEASE_LUA = (Path(redisync.__file__).parent / "store" / "lua" / "lease.lua").read_text()


def url(server, user: str) -> str:
    return f"redis://{user}:{user}-change-me@127.0.0.1:{server.port}/0"


def on_build(store, build: str):
    """The store as a redisync build of another version would use it: the same Lua, another text
    (a comment), so another digest and another library."""
    if build == "b":
        store.scripts = Library(store.redis, edit={"lease.lua": LEASE_LUA + "\n-- build b\n"})
    return store


@pytest.fixture
def acl_server(tmp_path):
    server = RedisProcess(tmp_path, None, "--aclfile", str(ACL)).start_authenticated("learner", "learner-change-me")
    yield server
    server.kill()


def _publish(store, shard_id: int, count: int) -> None:
    shard = store.shard(shard_id, resume=True)
    assert shard.publish({"obs/norm": {"count": count, "sum": [float(count), 1.0]}}).applied


def test_two_versions_publish_and_pull_in_one_run_with_acl_roles(acl_server):
    """A collector on build A and a learner on build B: each version's library loaded once by the
    learner's role, as deploy/README.md says; both publish and pull; neither removes the other's
    (build B's library used to replace A's, and the collector was refused for good)."""
    learner_a = redisync.connect(url(acl_server, "learner"), run=RUN)
    learner_a.load_functions()  # version A, loaded by the learner's role (the collector's may not)
    collector = redisync.connect(url(acl_server, "collector"), run=RUN)
    collector.register(SCHEMA)
    _publish(collector, 0, 2)
    learner_b = on_build(redisync.connect(url(acl_server, "learner"), run=RUN), "b")
    assert learner_b.scripts.version != collector.scripts.version
    assert learner_b.fleet().keys["obs/norm"].parts()["count"] == 2  # build B loads its own library
    _publish(collector, 0, 3)  # build A's collector still publishes ...
    _publish(learner_b, 1, 5)  # ... beside build B's folds
    for store in (collector, learner_b):
        assert store.fleet().keys["obs/norm"].parts()["count"] == 8
    assert {collector.scripts.version, learner_b.scripts.version} <= {v.version for v in learner_b.functions()}


def test_a_rolling_upgrade_of_a_live_fleet_then_the_old_version_retired(acl_server):
    """The procedure of deploy/README.md: load the new version with the learner's role, restart the
    collectors one by one on it (resuming their slots), then prune the old version: the fleet stays
    exact throughout."""
    learner_a = redisync.connect(url(acl_server, "learner"), run=RUN)
    learner_a.load_functions()
    old = [redisync.connect(url(acl_server, "collector"), run=RUN) for _ in range(3)]
    old[0].register(SCHEMA)
    for i, store in enumerate(old):
        _publish(store, i, 10 + i)
    learner_b = on_build(redisync.connect(url(acl_server, "learner"), run=RUN), "b")
    learner_b.load_functions()  # step 1: the new version beside the old
    new = []
    for i in range(3):  # step 2: each collector restarted on the new build
        store = on_build(redisync.connect(url(acl_server, "collector"), run=RUN), "b")
        _publish(store, i, 20 + i)
        new.append(store)
        counts = [20 + j if j <= i else 10 + j for j in range(3)]
        assert learner_b.fleet().keys["obs/norm"].parts()["count"] == sum(counts)
        for other in old[i + 1 :]:  # the old build's collectors go on meanwhile
            assert other.fleet().keys["obs/norm"].parts()["count"] == sum(counts)
    assert learner_b.prune_functions() == [f"redisync_{learner_a.scripts.version}"]  # step 3
    assert {v.version for v in learner_b.functions()} == {learner_b.scripts.version}
    _publish(new[0], 0, 30)
    parts = learner_b.fleet().keys["obs/norm"].parts()
    assert parts["count"] == 30 + 21 + 22
    np.testing.assert_array_equal(parts["sum"], [30.0 + 21.0 + 22.0, 3.0])
