"""deploy/users.acl against a real server: each role does its job and is refused outside it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis

import redisync
from redisync import errors
from redisync.store.schema import Schema, broadcast, merge

from ..servers import RedisProcess
from ..support import wait_for

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

ACL = Path(__file__).resolve().parents[2] / "deploy" / "users.acl"
RUN = "humanoid-v3"
SCHEMA = Schema.of({"obs/norm": merge(2, lifecycle="history"), "curriculum/scale": broadcast(())})


@pytest.fixture
def acl_server(tmp_path):
    server = RedisProcess(tmp_path, None, "--aclfile", str(ACL)).start_authenticated("learner", "learner-change-me")
    redisync.connect(url(server, "learner"), run=RUN).load_functions()  # as deploy/README.md says: the learner loads
    yield server
    server.kill()


def url(server, user: str) -> str:
    return f"redis://{user}:{user}-change-me@127.0.0.1:{server.port}/0"


def test_collector_publishes_and_pulls_its_run_only(acl_server):
    """The collector role publishes, pulls and follows its own run; another run, a snapshot and any other
    command are refused."""
    store = redisync.connect(url(acl_server, "collector"), run=RUN)
    store.register(SCHEMA)
    shard = store.shard(0)
    assert shard.publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}}).applied
    assert shard.pull().fleet_version == 1
    sub = store.redis.pubsub()
    sub.subscribe(store.keys.channel)  # its run's channel: allowed
    sub.ssubscribe(store.keys.channel)  # and as a shard channel
    other = redisync.connect(url(acl_server, "collector"), run="other-run")
    with pytest.raises(errors.PermissionDenied, match="other-run"):
        other.register(SCHEMA)
    with pytest.raises(errors.PermissionDenied):
        store.snapshot()  # checkpoints are the learner's
    with pytest.raises(redis.exceptions.NoPermissionError):
        store.redis.flushall()
    for follow in ("subscribe", "ssubscribe"):
        foreign = store.redis.pubsub()
        getattr(foreign, follow)("redisync:{other-run}:versions")
        with pytest.raises(redis.exceptions.NoPermissionError):
            foreign.get_message(timeout=2)


def test_learner_snapshots_and_restores(acl_server):
    """The learner role publishes decisions, snapshots and restores its own run, and no other run's."""
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
    """The inspector role reads a run's metadata and state and is refused every write."""
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
    """A connection without a user, or with a wrong password, is PermissionDenied."""
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
        redisync.connect(url(server, "learner"), run=RUN).load_functions()
        store = redisync.connect(url(server, "noinfo"), run=RUN)
        with pytest.raises(errors.PermissionDenied, match=r"may not run INFO.*grant \+info"):
            store.register(SCHEMA)
        assert redisync.connect(url(server, "learner"), run=RUN).redis.hgetall(f"redisync:{{{RUN}}}:meta") == {}
        redisync.connect(url(server, "collector"), run=RUN).register(SCHEMA)  # the deployed role may
    finally:
        server.kill()


def test_a_collector_that_finds_no_library_is_refused_naming_the_permission_until_the_learner_loads_it(tmp_path):
    """A collector that may not load functions and finds none is refused naming the permission it lacks, until
    the learner loads the library; then it publishes."""
    server = RedisProcess(tmp_path, None, "--aclfile", str(ACL)).start_authenticated("learner", "learner-change-me")
    try:
        collector = redisync.connect(url(server, "collector"), run=RUN)
        with pytest.raises(errors.PermissionDenied, match=r"\+function\|load"):
            collector.register(SCHEMA)
        learner = redisync.connect(url(server, "learner"), run=RUN)
        assert learner.redis.hgetall(f"redisync:{{{RUN}}}:meta") == {}  # nothing written
        learner.load_functions()
        collector.register(SCHEMA)
        collector.shard(0).publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})
    finally:
        server.kill()


def test_refusals_say_who_may_not_do_what_in_our_words(acl_server):
    """Not Redis' raw text: the missing credentials, the missing permission by name, the bad password."""
    anonymous = redisync.connect(f"redis://127.0.0.1:{acl_server.port}/0", run=RUN)
    with pytest.raises(errors.PermissionDenied, match=r"requires a user and password: put them in the URL"):
        anonymous.run_info()
    collector = redisync.connect(url(acl_server, "collector"), run=RUN)
    with pytest.raises(
        errors.PermissionDenied, match=r"user 'collector' may not run HGETALL \(its ACL lacks \+hgetall"
    ):
        collector.run_info()  # inspecting is the learner's and the inspector's
    wrong = redisync.connect(f"redis://collector:wrong@127.0.0.1:{acl_server.port}/0", run=RUN)
    with pytest.raises(errors.PermissionDenied, match=r"refused user 'collector': wrong password"):
        wrong.run_info()


DEPLOY_README = ACL.parent / "README.md"


def _roles_table() -> dict[str, dict[str, bool]]:
    """deploy/README.md's roles table: operation -> role -> allowed."""
    text = DEPLOY_README.read_text()
    lines = text[text.index("<!-- the roles table") :].splitlines()[1:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = {role: cell == "yes" for role, cell in zip(header[1:], cells[1:], strict=False)}
    return table


def _operations(server) -> dict:
    """Each row of the table as a call made with a role's credentials (the run registered, one report in)."""
    setup = redisync.connect(url(server, "learner"), run=RUN)
    setup.register(SCHEMA)
    setup.shard(7).publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}})
    snap = setup.snapshot()

    def follow(store):
        sub = store.redis.pubsub()
        sub.ssubscribe(store.keys.channel)
        sub.subscribe(store.keys.channel)
        assert [sub.get_message(timeout=2)["type"] for _ in range(2)] == ["ssubscribe", "subscribe"]

    return {
        "load redisync's functions onto the server": lambda s: s.load_functions(),
        "list the redisync versions on the server (`redisync functions list`)": lambda s: s.functions(),
        "retire other redisync versions (`redisync functions prune`)": lambda s: s.prune_functions(),
        "register the run's schema": lambda s: s.register(SCHEMA),
        "publish a report (the fold)": lambda s: s.shard(1).publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}}),
        "pull the fleet state (`pull()`, `fleet()`)": lambda s: (
            s.fleet().keys["obs/norm"].parts()["count"] >= 2 or pytest.fail("no state"),
            s.shard(3, incarnation=1).pull(),
        ),
        "inspect the run (`redisync inspect`, `key_info()`)": lambda s: s.run_info() and s.key_info("obs/norm"),
        "follow the run's versions channel": follow,
        "snapshot the run": lambda s: s.snapshot(),
        "restore a snapshot": lambda s: s.restore(snap),
        "write a run key directly (HSET)": lambda s: s.redis.hset(s.keys.prefix + "scratch", "x", 1),
        "read another run's keys": lambda s: s.redis.hgetall("redisync:{other-run}:meta"),
    }


def test_every_role_does_what_the_deploy_readme_says_and_nothing_more(acl_server):
    """Each role of users.acl may do exactly what deploy/README.md's table says, and nothing more."""
    table, operations = _roles_table(), _operations(acl_server)
    assert set(table) == set(operations), "the table and the test name the same operations"
    assert all(set(row) == {"collector", "learner", "inspector"} for row in table.values())
    for what, roles in table.items():
        for role, allowed in roles.items():
            store = redisync.connect(url(acl_server, role), run=RUN)
            if allowed:
                operations[what](store)
            else:
                with pytest.raises((errors.PermissionDenied, redis.exceptions.NoPermissionError)):
                    operations[what](store)
    # nothing the refused operations tried was written: the run is as the learner left it
    learner = redisync.connect(url(acl_server, "learner"), run=RUN)
    assert learner.key_info("obs/norm")["writers"] in ("1,7", "7")


def test_a_role_that_may_not_use_shard_channels_still_announces_and_follows(tmp_path):
    """A collector role of an earlier deploy/users.acl (PUBLISH and SUBSCRIBE, no SPUBLISH or
    SSUBSCRIBE): its folds announce on the plain channel, and a Syncer's listener, refused the shard
    channel, follows the plain one and hears another collector's folds."""
    from redisync.collector.workers import new_syncer

    legacy_line = next(line for line in ACL.read_text().splitlines() if line.startswith("user collector "))
    legacy_line = legacy_line.replace("user collector", "user legacy").replace(
        "collector-change-me", "legacy-change-me"
    )
    for command in ("+spublish", "+ssubscribe", "+sunsubscribe"):
        legacy_line = legacy_line.replace(f" {command}", "")
    acl = tmp_path / "users.acl"
    acl.write_text(ACL.read_text() + legacy_line + "\n")
    acl_server = RedisProcess(tmp_path, None, "--aclfile", str(acl)).start_authenticated("learner", "learner-change-me")
    redisync.connect(url(acl_server, "learner"), run=RUN).load_functions()
    legacy = f"redis://legacy:legacy-change-me@127.0.0.1:{acl_server.port}/0"
    store = redisync.connect(legacy, run=RUN)
    store.register(SCHEMA)
    plain = store.redis.pubsub()
    plain.subscribe(store.keys.channel)
    assert plain.get_message(timeout=2)["type"] == "subscribe"
    store.shard(5).publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    heard = plain.get_message(timeout=2)
    assert heard is not None
    assert heard["type"] == "message"
    assert heard["data"].startswith(b"1 ")

    class Norm:
        def schema_entries(self):
            return SCHEMA.keys

        def report_shard_state(self):
            return {}

        def apply_shard_state(self, fleet) -> None:
            pass

    syncer = new_syncer(redisync.connect(legacy, run=RUN), 0, [Norm()], worker="thread", retry_every_s=0.05)
    syncer.start()
    try:
        assert wait_for(lambda: syncer.worker._subscribed, timeout=20)
        assert syncer.worker._shard_channel is False
        store.shard(6).publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
        assert wait_for(lambda: syncer.worker._announced >= 2, timeout=20)  # heard on the plain channel
    finally:
        syncer.stop(flush=False)
        acl_server.kill()
