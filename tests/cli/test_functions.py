"""`redisync functions`: list, load and prune the library's versions on a server."""

from __future__ import annotations

import re

import pytest

import redisync as redisync_api

from .conftest import cli


@pytest.fixture
def own_url(tmp_path):
    """A redis-server of this test's own: a prune deletes every other version's library server-wide,
    which on the shared server would remove other checkouts' and versions' functions."""
    from ..servers import RedisProcess

    server = RedisProcess(tmp_path).start()
    yield server.url
    server.stop()


@pytest.mark.integration  # a redis-server of its own
def test_functions_lists_loads_and_prunes_redisync_versions(own_url):
    """``redisync functions``: the versions on a server, this build's loaded beside another's, and
    the other one retired (only redisync's libraries are touched)."""
    from redisync.store.library import Library

    real_url = own_url
    store = redisync_api.connect(real_url, run="functions-cli")
    Library(store.redis, version="cli0ld").load()  # another version's library on the server
    out = cli("functions", "load", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert f"loaded redisync's functions of version {store.scripts.version}" in out.stdout
    out = cli("functions", "list", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert "cli0ld" in out.stdout
    assert re.search(rf"{store.scripts.version}.*this build", out.stdout)
    out = cli("functions", "prune", "--url", real_url)
    assert out.returncode == 0, out.stderr
    assert "redisync_cli0ld" in out.stdout
    assert "cli0ld" not in {lib.version for lib in store.functions()}
    assert store.scripts.version in {lib.version for lib in store.functions()}
