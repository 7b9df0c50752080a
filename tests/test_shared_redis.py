"""The tests share the machine's Redis with every other test worker, checkout and redisync version:
a server-wide command there (a prune of the libraries, FUNCTION FLUSH or DELETE, FLUSHALL, FLUSHDB,
CONFIG SET, SHUTDOWN, SCRIPT FLUSH) would remove or change what the others rely on. The guard of
``tests/guard`` refuses them at run time, in this process and in every Python process a test starts;
these tests point it at a server of their own (standing in for the shared one), so that a guard
that let a command through would damage nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import redisync_test_guard

import redisync
from redisync.store.library import Library

from .conftest import REAL_URL
from .servers import RedisProcess

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    own = RedisProcess(tmp_path_factory.mktemp("shared")).start()
    yield own
    own.stop()


@pytest.fixture
def as_shared(server, monkeypatch, tmp_path):
    """``server`` guarded as the shared one is, with a refusal log of this test's own (the suite's
    fixture would otherwise fail this test for the refusals it provokes on purpose)."""
    monkeypatch.setenv(redisync_test_guard.SHARED, f"127.0.0.1:{server.port}")
    monkeypatch.setenv(redisync_test_guard.LOG_DIR, str(tmp_path))
    client = redis.Redis(port=server.port, db=3)
    client.set("someone-elses", "data")
    yield client
    client.close()


SERVER_WIDE = [
    ("FLUSHDB",),
    ("FLUSHALL",),
    ("CONFIG", "SET", "maxclients", "100"),
    ("SCRIPT", "FLUSH"),
    ("FUNCTION", "FLUSH"),
    ("FUNCTION", "DELETE", "redisync_0ld"),
    ("SHUTDOWN", "NOSAVE"),
    ("CLIENT", "PAUSE", "100"),
]


@pytest.mark.integration  # a redis-server of its own
@pytest.mark.parametrize("command", SERVER_WIDE, ids=" ".join)
def test_a_server_wide_command_is_refused_on_the_shared_server_and_logged(as_shared, server, command):
    """Sent as a call, or in a pipeline: refused before it leaves, logged, and the server untouched."""
    with pytest.raises(redisync_test_guard.SharedServerCommand, match=r"server-wide|did not create"):
        as_shared.execute_command(*command)
    pipe = as_shared.pipeline(transaction=False)
    pipe.ping()
    pipe.execute_command(*command)
    with pytest.raises(redisync_test_guard.SharedServerCommand):
        pipe.execute()
    assert len(redisync_test_guard.refusals()) == 2
    assert as_shared.get("someone-elses") == b"data"  # the database was not flushed, the server is up
    # the same command on a server that is not the shared one runs (here: a harmless one of them)
    os.environ.pop(redisync_test_guard.SHARED)
    assert as_shared.execute_command("CONFIG", "SET", "slowlog-max-len", "128") in (b"OK", True)


@pytest.mark.integration
def test_a_store_loads_its_library_but_replaces_or_deletes_no_one_elses(as_shared, server):
    """What a store does on first meeting a server (load this version's library) passes; a library
    of another version's code is neither replaced nor deleted; one this run created may be deleted."""
    store = redisync.connect(server.url.replace("/0", "/3"), run="guarded")
    store.register(redisync.Schema.of({"obs/norm": redisync.merge(2, lifecycle="history")}))
    store.shard(0).publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})
    assert store.fleet().keys["obs/norm"].parts()["count"] == 1
    other = Library(redis.Redis(port=server.port), version="0ld")
    os.environ.pop(redisync_test_guard.SHARED)  # (another version's library, loaded by its own user)
    other.load()
    os.environ[redisync_test_guard.SHARED] = f"127.0.0.1:{server.port}"
    changed = "#!lua name=redisync_0ld\nredis.register_function('x0ld', function() return 1 end)\n"
    with pytest.raises(redisync_test_guard.SharedServerCommand, match="other code"):
        as_shared.function_load(changed, replace=True)
    with pytest.raises(redisync_test_guard.SharedServerCommand, match="did not create"):
        as_shared.function_delete("redisync_0ld")
    mine = "#!lua name=redisync_guard_test\nredis.register_function('guard_test_f', function() return 1 end)\n"
    as_shared.function_load(mine)
    as_shared.function_delete("redisync_guard_test")
    names = {lib[b"library_name"] if isinstance(lib, dict) else lib[1] for lib in as_shared.function_list()}
    assert b"redisync_0ld" in names
    assert len(redisync_test_guard.refusals()) == 2
    store.delete()


@pytest.mark.integration
def test_a_cli_prune_started_by_a_test_is_refused_and_the_other_version_stays(as_shared, server):
    """``redisync functions prune`` run by a test against the shared server (once a test did, and
    removed every other version's library): the command's process is guarded too, the other
    version's library stays loaded, and the refusal is logged for the suite to fail that test."""
    os.environ.pop(redisync_test_guard.SHARED)
    Library(redis.Redis(port=server.port), version="0ld").load()
    os.environ[redisync_test_guard.SHARED] = f"127.0.0.1:{server.port}"
    out = subprocess.run(
        [sys.executable, "-m", "redisync.cli", "functions", "prune", "--url", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "0ld" in {lib.version for lib in redisync.store.library.loaded(as_shared)}
    assert any("FUNCTION DELETE 'redisync_0ld'" in line for line in redisync_test_guard.refusals())


def test_every_test_process_runs_guarded():
    """This process is guarded, and the Python processes it starts find the guard on their path."""
    from redis.connection import AbstractConnection

    assert getattr(AbstractConnection, "_redisync_guarded", False)
    out = subprocess.run(
        [sys.executable, "-c", "from redis.connection import AbstractConnection as C; print(C._redisync_guarded)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "True", out.stderr
    assert os.environ[redisync_test_guard.SHARED] in REAL_URL


def test_no_test_names_the_shared_server_by_its_port():
    """The shared server is ``REDISYNC_TEST_URL`` or ``REDIS_PORT`` (tests/conftest.py), never a
    port written into a test: one that did would reach another server than the suite's."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.name == "conftest.py" and path.parent == TESTS:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"(127\.0\.0\.1|localhost):6379\b", line):
                offenders.append(f"{path.relative_to(TESTS)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
