"""Real ``redis-server`` processes on free ports, for tests that kill, restart or reconfigure them."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from redisync import redis_server
from redisync.lifeline import popen


class RedisProcess:
    """One redis-server; ``kill()`` is SIGKILL by pid, ``start()`` (re)starts it on the same port."""

    def __init__(self, workdir: Path, port: int | None = None, *args: str, conf: Path | None = None):
        if not shutil.which("redis-server"):
            pytest.fail("redis-server is not installed (scripts/ensure-redis installs it)")
        self.workdir, self.port, self.args, self.conf = workdir, port or redis_server.free_port(), args, conf
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


class LoopbackCluster:
    """A Redis Cluster on loopback: ``primaries`` primaries with ``replicas`` replicas each, every node a
    `RedisProcess` (killed by pid at ``stop()``); ``cluster-require-full-coverage no``, as
    deploy/redis-cluster.conf has it, so a failing primary stops only the runs in its slots."""

    def __init__(self, workdir: Path, primaries: int = 3, replicas: int = 0, node_timeout_ms: int = 2000):
        self.nodes: list[RedisProcess] = []
        for i in range(primaries * (1 + replicas)):
            d = workdir / f"node{i}"
            d.mkdir(parents=True, exist_ok=True)
            args = redis_server.cluster_node_args(d, "--cluster-node-timeout", str(node_timeout_ms))
            self.nodes.append(RedisProcess(d, redis_server.free_port(), *args))
        self.replicas = replicas

    def start(self) -> LoopbackCluster:
        for node in self.nodes:
            node.start()
        redis_server.create_cluster([n.port for n in self.nodes], self.replicas)
        self.wait_ok()
        self.wait_replicas_in_sync()
        return self

    def wait_replicas_in_sync(self, timeout: float = 30.0) -> None:
        """Until every replica's link to its primary is up and its first sync done (a manual
        failover of a replica still syncing is refused)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [
                self.client(n).info("replication") for n in self.nodes if n.proc is not None and n.proc.poll() is None
            ]
            replicas = [i for i in infos if i["role"] == "slave"]
            if len(replicas) >= self.replicas * (len(self.nodes) // (1 + self.replicas)) and all(
                i.get("master_link_status") == "up" and not i.get("master_sync_in_progress") for i in replicas
            ):
                return
            time.sleep(0.1)
        pytest.fail(f"the replicas did not sync within {timeout:g} s")

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def client(self, node: RedisProcess) -> redis.Redis:
        return redis.Redis(port=node.port, retry=Retry(NoBackoff(), 0), decode_responses=True, socket_timeout=2)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node says the cluster is ok and agrees on who serves each slot."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
                infos = [self.client(n).cluster("info") for n in live]
                slots = {str(sorted(map(str, self.client(n).cluster("slots")))) for n in live}
                if all(i["cluster_state"] == "ok" for i in infos) and len(slots) == 1:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        pytest.fail(f"the cluster did not settle within {timeout:g} s")

    def role(self, node: RedisProcess) -> str:
        """``master`` or ``slave``, as the node itself says."""
        return str(self.client(node).info("replication")["role"])

    def primary_of(self, key: str) -> RedisProcess:
        """The node that serves ``key``'s slot now, as a live node's CLUSTER SLOTS says."""
        slot = redis.cluster.key_slot(key.encode())
        live = next(n for n in self.nodes if n.proc is not None and n.proc.poll() is None)
        for first, last, primary, *_ in self.client(live).cluster("slots"):
            if first <= slot <= last:
                return next(n for n in self.nodes if n.port == int(primary[1]))
        raise LookupError(f"no node serves slot {slot}")

    def replica_of(self, primary: RedisProcess) -> RedisProcess:
        """A node that replicates ``primary``."""
        master_id = self.client(primary).cluster("myid")
        for node in self.nodes:
            if node is not primary and node.proc is not None and node.proc.poll() is None:
                info = self.client(node).info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == primary.port:
                    return node
        raise LookupError(f"no replica of {master_id}")

    def failed(self, node: RedisProcess, *unasked: RedisProcess) -> bool:
        """Whether a live node's view of the cluster flags ``node`` as failed (agreed, not only
        suspected); ``unasked``: nodes not to ask (paused ones)."""
        live = [
            n for n in self.nodes if n is not node and n not in unasked and n.proc is not None and n.proc.poll() is None
        ]
        for other in live:
            try:
                lines = self.client(other).execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            text = lines if isinstance(lines, str) else "\n".join(str(x) for x in lines)
            for line in text.splitlines():
                fields = line.split()
                if len(fields) > 2 and fields[1].startswith(f"127.0.0.1:{node.port}@"):
                    return "fail" in fields[2].split(",")
        return False

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()
