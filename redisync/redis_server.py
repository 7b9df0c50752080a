"""How redisync starts a ``redis-server`` of its own — benches, the soak, the tests' private servers:
one command line, so that every such server is the same kind of server.

Bound to loopback, in the foreground (so its starter holds its pid and can stop it), its files in a
directory of the caller's; without a configuration file it touches no disk (no snapshots, no
append-only file), with one the file's persistence settings hold. Start it with
:func:`redisync.lifeline.popen` so that it cannot outlive its starter.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


def command(port: int, workdir: str | Path, *args: str, conf: str | Path | None = None) -> list[str]:
    """The ``redis-server`` command line: on ``127.0.0.1:port``, files in ``workdir``, then ``args``."""
    base = [str(conf)] if conf is not None else ["--save", "", "--appendonly", "no"]
    return [
        "redis-server",
        *base,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(workdir),
        "--daemonize",
        "no",
        *args,
    ]


def free_port() -> int:
    """A TCP port nobody listens on now, with its Cluster bus port (+10000) free too."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536:
            with socket.socket() as bus:
                try:
                    bus.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


def sentinel_command(conf: str | Path) -> list[str]:
    """A Sentinel's command line, from its configuration file (its port and directory are there)."""
    return ["redis-server", str(conf), "--sentinel"]


def cluster_node_args(node_dir: str | Path, *extra: str) -> list[str]:
    """A Cluster node's arguments (after `command`'s): its node file in ``node_dir``, and a failing
    primary stopping only the runs in its slots (``cluster-require-full-coverage no``, as deploy/
    has it); then ``extra``."""
    node_file = str(Path(node_dir) / "nodes.conf")
    return [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        node_file,
        "--cluster-require-full-coverage",
        "no",
        *extra,
    ]


def create_cluster(ports: list[int], replicas: int = 0) -> None:
    """Join the started nodes on ``ports`` into one Cluster, ``replicas`` replicas per primary."""
    subprocess.run(
        [
            *("redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports]),
            *("--cluster-replicas", str(replicas), "--cluster-yes"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )


@contextlib.contextmanager
def loopback_cluster(workdir: str | Path, primaries: int = 3) -> Iterator[str]:
    """A Redis Cluster of ``primaries`` primaries on loopback, for benches: its
    ``redis+cluster://`` URL while the context lasts, every node stopped after it (and with its
    starter, should that die first). ``cluster-require-full-coverage no``, as deploy/ has it."""
    from .lifeline import popen

    procs = []
    ports = []
    try:
        for i in range(primaries):
            port = free_port()
            node = Path(workdir) / f"node{i}"
            node.mkdir(parents=True, exist_ok=True)
            args = cluster_node_args(node, "--maxclients", "20000")  # (a thousand collectors' connections)
            procs.append(popen(command(port, node, *args), stdout=subprocess.DEVNULL))
            ports.append(port)
        for port in ports:
            _wait_answers(port)
        create_cluster(ports)
        for port in ports:
            _wait_answers(port, "cluster_state:ok")
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def _wait_answers(port: int, says: str | None = None, timeout: float = 30.0) -> None:
    """Until the server on ``port`` answers (and its CLUSTER INFO says ``says``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        command_ = ["redis-cli", "-p", str(port)] + (["cluster", "info"] if says else ["ping"])
        done = subprocess.run(command_, capture_output=True, text=True, timeout=10)
        if done.returncode == 0 and (says or "PONG") in done.stdout:
            return
        time.sleep(0.1)
    raise TimeoutError(f"redis-server on port {port} did not answer{' ' + says if says else ''} within {timeout:g} s")
