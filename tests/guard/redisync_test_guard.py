"""The tests share the machine's Redis with other test workers, other checkouts and other redisync
versions: a server-wide command there (a FUNCTION FLUSH, a prune of the libraries, FLUSHALL,
CONFIG SET, SHUTDOWN, ...) would remove or change what they rely on. This guard refuses such a
command at run time, in every process of a test run (the pytest workers, and every Python process
they start: it is installed by the ``sitecustomize`` beside it, which ``tests/conftest.py`` puts on
``PYTHONPATH``), and records each refusal in a log that the suite's fixture turns into a failing
test - so a refusal swallowed by a caller's ``except`` still fails.

The shared server is ``REDISYNC_TEST_SHARED`` (``host:port``, set from the tests' URL); a server a
test started itself (on a port of its own) is not guarded. On the shared server a test may still
load a function library of a new name or its own identical text again (what a store does the first
time it meets a server), and delete a library that this test run created; nothing else
server-wide.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

SHARED = "REDISYNC_TEST_SHARED"  # host:port of the shared server
LOG_DIR = "REDISYNC_TEST_GUARD_DIR"  # refusals.log and created.txt (the libraries this run created)

REFUSED = {
    "FLUSHALL": None,
    "FLUSHDB": None,
    "SHUTDOWN": None,
    "SWAPDB": None,
    "DEBUG": None,
    "MONITOR": None,
    "REPLICAOF": None,
    "SLAVEOF": None,
    "FAILOVER": None,
    "SAVE": None,
    "BGSAVE": None,
    "BGREWRITEAOF": None,
    "CONFIG": {"SET", "REWRITE", "RESETSTAT"},
    "SCRIPT": {"FLUSH", "KILL"},
    "FUNCTION": {"FLUSH", "RESTORE", "KILL"},
    "ACL": {"SETUSER", "DELUSER", "LOAD", "SAVE"},
    "CLIENT": {"KILL", "PAUSE", "NO-EVICT"},
    "SLOWLOG": {"RESET"},
    "LATENCY": {"RESET"},
    "MODULE": {"LOAD", "UNLOAD", "LOADEX"},
    "CLUSTER": {"RESET", "FLUSHSLOTS", "FAILOVER"},
}
"""Command -> the subcommands refused (None: the command itself)."""


class SharedServerCommand(RuntimeError):
    """A test sent a server-wide command to the shared Redis."""


_lock = threading.Lock()


def _text(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _shared(connection: Any) -> bool:
    target = os.environ.get(SHARED)
    if not target or not hasattr(connection, "port"):
        return False
    host, _, port = target.rpartition(":")
    local = {"127.0.0.1", "localhost", "::1"}
    same_host = connection.host == host or (connection.host in local and host in local)
    return same_host and str(connection.port) == port


def _created() -> Path | None:
    folder = os.environ.get(LOG_DIR)
    return Path(folder) / "created.txt" if folder else None


def _library_name(code: str) -> str:
    match = re.match(r"#!lua\s+name=(\S+)", code)
    return match.group(1) if match else ""


def _existing_code(connection: Any, name: str) -> str | None:
    """The code of library ``name`` on the shared server, None if it has none (its own connection)."""
    import redis

    client = redis.Redis(host=connection.host, port=connection.port, socket_timeout=5)
    try:
        for library in client.function_list(library=name, withcode=True):
            fields = library if isinstance(library, dict) else dict(zip(library[::2], library[1::2], strict=False))
            fields = {_text(k): v for k, v in fields.items()}
            if _text(fields.get("library_name", b"")) == name:
                return _text(fields.get("library_code", b""))
        return None
    finally:
        client.close()


def verdict(connection: Any, args: tuple[Any, ...]) -> str | None:
    """Why ``args`` may not go to the shared server over ``connection``; None where it may."""
    if not args or not _shared(connection):
        return None
    # (redis-py sends e.g. "FUNCTION DELETE" as one argument at times)
    args = (*_text(args[0]).split(), *args[1:])
    command, sub = _text(args[0]).upper(), (_text(args[1]).upper() if len(args) > 1 else "")
    refused = REFUSED.get(command, set())
    if refused is None or sub in refused:
        return f"{command} {sub}".strip() + " is server-wide"
    if command == "FUNCTION" and sub == "LOAD":
        code = _text(args[-1])
        name = _library_name(code)
        existing = _existing_code(connection, name)
        if existing is not None and existing != code:
            return f"FUNCTION LOAD would replace library {name!r}, which holds other code (another version's or checkout's)"
        created = _created()
        if existing is None and created is not None:
            with _lock, created.open("a") as out:
                out.write(name + "\n")
        return None
    if command == "FUNCTION" and sub == "DELETE":
        name = _text(args[2]) if len(args) > 2 else ""
        created = _created()
        ours = created is not None and created.exists() and name in created.read_text().split()
        return None if ours else f"FUNCTION DELETE {name!r}: a library this test run did not create"
    return None


def _refuse(reason: str, args: tuple[Any, ...]) -> None:
    folder = os.environ.get(LOG_DIR)
    shown = " ".join(_text(a)[:60] for a in args[:4]).replace("\n", " ")
    line = f"pid {os.getpid()}: {reason}: {shown}\n"
    if folder:
        with _lock, (Path(folder) / "refusals.log").open("a") as log:
            log.write(line)
    raise SharedServerCommand(f"refused on the shared Redis {os.environ.get(SHARED)}: {line.strip()}")


def install() -> None:
    """Wrap redis-py's sending and packing of commands (every command, single or pipelined, passes
    through one of them)."""
    from redis.connection import AbstractConnection

    if getattr(AbstractConnection, "_redisync_guarded", False):
        return
    send_command = AbstractConnection.send_command
    pack_command, pack_commands = AbstractConnection.pack_command, AbstractConnection.pack_commands

    def guarded_send_command(self: Any, *args: Any, **kwargs: Any) -> Any:
        reason = verdict(self, args)
        if reason:
            _refuse(reason, args)
        return send_command(self, *args, **kwargs)

    def guarded_pack_command(self: Any, *args: Any) -> Any:
        reason = verdict(self, args)
        if reason:
            _refuse(reason, args)
        return pack_command(self, *args)

    def guarded_pack_commands(self: Any, commands: Any) -> Any:
        commands = list(commands)
        for args in commands:
            reason = verdict(self, tuple(args))
            if reason:
                _refuse(reason, tuple(args))
        return pack_commands(self, commands)

    AbstractConnection.send_command = guarded_send_command  # type: ignore[method-assign]
    AbstractConnection.pack_command = guarded_pack_command  # type: ignore[method-assign]
    AbstractConnection.pack_commands = guarded_pack_commands  # type: ignore[method-assign]
    AbstractConnection._redisync_guarded = True  # type: ignore[attr-defined]


def refusals() -> list[str]:
    """The refusals logged so far in this test run."""
    folder = os.environ.get(LOG_DIR)
    log = Path(folder) / "refusals.log" if folder else None
    return log.read_text().splitlines() if log is not None and log.exists() else []
