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


def test_timeout_sets_how_long_each_call_waits_and_a_silent_server_is_one_line():
    """``--timeout`` on every command that talks to a server: each call waits that long, retried once
    (a silent server cost 22 s a command, 13.5 s even with socket_timeout=1 in the URL: three retries
    with back-off); the failure is one line naming the URL."""
    from click.testing import CliRunner

    from redisync.cli import cli

    from ..faults import SilentServer

    for command in ("inspect", "watch", "snapshot", "restore", "bench", "exporter", "aggregate", "demo"):
        help_text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--timeout" in help_text, command
    silent = SilentServer()
    try:
        common._set_timeout(None, None, 0.3)  # type: ignore[arg-type]  (what --timeout 0.3 does)
        store = common.cli_connect(silent.url, "any")
        kwargs = store.redis.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.3
        assert store.redis.get_retry().get_retries() == 1
        out = _cli("inspect", "--url", silent.url, "--timeout", "0.3")
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1
        assert "no answer in time" in out.stderr
    finally:
        common._set_timeout(None, None, common.DEFAULT_TIMEOUT_S)  # type: ignore[arg-type]
        silent.close()


def test_a_port_out_of_range_is_one_line():
    """``redis://127.0.0.1:99999`` was a traceback (an OverflowError from the socket)."""
    out = _cli("inspect", "--url", "redis://127.0.0.1:99999/0")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "'99999' is not a TCP port" in out.stderr


def test_a_server_that_is_not_redis_is_named_so():
    """An HTTP server on the port read ``Protocol error, got "H"``: now it says the server does not
    speak Redis' protocol."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def answer() -> None:
            with listener.accept()[0] as peer:
                peer.recv(1024)
                peer.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        import threading

        threading.Thread(target=answer, daemon=True).start()
        out = _cli("inspect", "--url", f"redis://127.0.0.1:{port}/0")
    assert out.returncode == 1
    assert "does not speak Redis' protocol" in out.stderr
    assert "Traceback" not in out.stderr
