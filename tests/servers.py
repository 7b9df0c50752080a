"""Real ``redis-server`` processes on free ports, for tests that kill, restart or reconfigure them."""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redisync import redis_server
from redisync.lifeline import popen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_cluster_port() -> int:
    """A free port whose cluster bus port (+10 000) is free too; Redis Cluster wants it below 55 536."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


class RedisProcess:
    """One redis-server; ``kill()`` is SIGKILL by pid, ``start()`` (re)starts it on the same port."""

    def __init__(self, workdir: Path, port: int | None = None, *args: str, conf: Path | None = None):
        if not shutil.which("redis-server"):
            pytest.fail("redis-server is not installed (scripts/ensure-redis installs it)")
        self.workdir, self.port, self.args, self.conf = workdir, port or free_port(), args, conf
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        return self.start_authenticated(None, None)

    def start_authenticated(self, username: str | None, password: str | None) -> RedisProcess:
        """Start, then wait until ``username`` (None: the default user) gets a PONG."""
        cmd = redis_server.command(self.port, self.workdir, *self.args, conf=self.conf)
        # (it dies with the test process: a killed test run leaves no server behind)
        self.proc = popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(
            port=self.port,
            username=username,
            password=password,
            socket_connect_timeout=0.2,
            retry=Retry(NoBackoff(), 0),
        )  # redis-py's default retry would back off for seconds
        deadline = time.monotonic() + 20  # generous: CI machines are shared
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"redis-server exited with {self.proc.returncode}: {' '.join(cmd)}")
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        self.kill()
        pytest.fail(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def redis_process(tmp_path):
    """A fresh redis-server of the test's own, stopped afterwards."""
    server = RedisProcess(tmp_path).start()
    yield server
    server.kill()
