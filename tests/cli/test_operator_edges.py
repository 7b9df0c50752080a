"""What an operator meets at the edges: a missing extra named whole, a Redis named the wrong way,
help text without markup, a silent address said to be silent."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

import redisync
from redisync import errors
from redisync.cli import common


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "redisync.cli", *args], capture_output=True, text=True, timeout=120)


def test_the_studys_missing_extra_names_mujoco_too(monkeypatch):
    """`redisync ab` without mujoco says the study extra brings it (it named gymnasium only)."""
    monkeypatch.setattr(common, "importable", lambda module: module != "mujoco")
    with pytest.raises(errors.RedisyncError, match=r"study extra \(mujoco missing\)"):
        common.needs("study")


def test_a_redis_given_by_another_option_name_is_pointed_to_url():
    """`redisync demo --redis URL` says 'Did you mean --url' (click suggested --bins, --envs, --seed)."""
    out = _cli("demo", "--redis", "redis://redis.example:7000/0")  # (refused before connecting)
    assert out.returncode == 2
    assert "Did you mean '--url'?" in out.stderr


def test_help_text_has_no_rst_markup():
    """`redisync aggregate --help` shows --index plainly, not ``--index``."""
    out = _cli("aggregate", "--help")
    assert out.returncode == 0
    assert "``" not in out.stdout


def test_an_address_that_never_answers_is_said_to_be_silent():
    """A server that accepts the connection and never answers (a black hole behind a proxy): the error
    says no answer came and what that may mean (it said only 'Timeout reading from socket')."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        store = redisync.connect(
            f"redis://127.0.0.1:{port}/0", run="x", socket_timeout=0.3, retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(errors.ConnectionUnavailable, match=r"no answer in time.*wrong address"):
            store.ping()
        store.close()


def test_a_cluster_with_no_reachable_node_is_a_typed_error_naming_its_url():
    """A Cluster URL none of whose nodes answers: ConnectionUnavailable with the URL, password masked
    (it was redis-py's untyped RedisClusterUnreachableError, raised by connect() itself)."""
    from redisync.redis_server import free_port

    url = f"redis+cluster://operator:s3cret@127.0.0.1:{free_port()}"
    with pytest.raises(errors.ConnectionUnavailable, match=r"no node of the Cluster answers") as caught:
        redisync.connect(url, run="x")
    assert "s3cret" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)
