"""How redisync starts a ``redis-server`` of its own — benches, the soak, the tests' private servers:
one command line, so that every such server is the same kind of server.

Bound to loopback, in the foreground (so its starter holds its pid and can stop it), its files in a
directory of the caller's; without a configuration file it touches no disk (no snapshots, no
append-only file), with one the file's persistence settings hold. Start it with
:func:`redisync.lifeline.popen` so that it cannot outlive its starter.
"""

from __future__ import annotations

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
