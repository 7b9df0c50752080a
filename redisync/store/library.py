"""The store's Lua as one Redis Functions library, loaded once per server and called by ``FCALL``.

A library keeps what its code makes for the life of the server's Lua VM: the fold's helpers are
made once when it loads, not at every call as an EVAL script makes them, and the server's own
identity is read once per VM (a restarted server starts a new VM). Every function's name carries
the library's version (``redisync_fold_<version>``): a client never runs functions of another
version, and where the server holds another version (or none, or lost it: a flush, a node that
never had it) the client loads its own in its place and calls again.

The library is ``lua/*.lua`` in one text, each file in a block of its own; ``struct.lua``, the
pure-Lua stand-in for Redis' C ``struct`` library, goes in as well and serves where the server has
no ``struct`` (the embedded fakeredis server): the same library runs on both.

Needs Redis 7.0 or later (or Valkey); an older server is refused with a typed error naming it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import threading
from typing import Any

import redis

from .. import errors

_LUA = importlib.resources.files("redisync.store") / "lua"
NAME = "redisync"
FUNCTIONS = ("fold", "pull", "register", "claim", "restore", "lease")
READ_ONLY = {"pull"}  # flagged no-writes: called by FCALL_RO
MINIMUM_SERVER = "Redis 7.0 or later (or Valkey 7.2 or later)"


def source(name: str = NAME, version: str | None = None, edit: dict[str, str] | None = None) -> tuple[str, str]:
    """The library's text and version. ``version`` defaults to the text's own digest; ``edit``
    replaces a file's text by name (the stage profiler loads cut copies of the fold under a name
    and version of their own).

    Redis gives a library's code no standard library while it loads (not even ``math``), only while
    a function runs: so the code is one function, ``make``, run once per VM at the first call, and
    each registered function calls what it made."""
    lines = [
        "-- the library's functions by name, made at the first call (see make)",
        "local made",
        "",
        "local function make()",
        "  local functions = {}",
        "  local function export(name, callback) functions[name] = callback end",
        "",
        "  -- struct.lua, for a server without Redis' C struct library (fakeredis)",
        "  local struct_standin = (function()",
        _LUA.joinpath("struct.lua").read_text().rstrip("\n"),
        "  end)()",
        "",
        "  -- Redis' struct where the server has it, else the stand-in",
        "  local function struct_library()",
        "    local ok, lib = pcall(function() return struct end)",
        "    return ok and lib or struct_standin",
        "  end",
        "",
        "  -- The server process: its run_id, read once per Lua VM. A VM cannot outlive its process (a",
        "  -- restart, one that reloads the append-only file, a promoted replica: each runs a VM of its own),",
        "  -- and the identity comes from the server, never from a client. 'embedded' for fakeredis, which",
        "  -- has no INFO and is one process for ever. Where the ACL denies the caller INFO and no call has",
        "  -- read it yet: nil and INFO's error (read again at the next call).",
        "  local server_id",
        "  local function server_identity()",
        "    if server_id then return server_id end",
        "    local info = redis.pcall('INFO', 'server')",
        "    -- (run_id is 40 characters; a plain search, where a pattern would be tried at every position)",
        "    local at = type(info) == 'string' and string.find(info, 'run_id:', 1, true)",
        "    if at then",
        "      server_id = string.sub(info, at + 7, at + 46)",
        "    elseif type(info) == 'table' and string.find(string.lower(tostring(info['err'])), 'unknown', 1, true) then",
        "      server_id = 'embedded'",
        "    end",
        "    return server_id, not server_id and tostring(type(info) == 'table' and info['err'] or 'no run_id') or nil",
        "  end",
    ]
    for function in FUNCTIONS:
        text = (edit or {}).get(function) or _LUA.joinpath(f"{function}.lua").read_text()
        lines += ["", f"  do -- {function}.lua", text.rstrip(), "  end"]
    lines += ["", "  return functions", "end"]
    body = "\n".join(lines) + "\n"
    version = version or hashlib.sha1(body.encode()).hexdigest()[:12]
    registrations = [
        f"redis.register_function{{function_name = '{name}_{function}_{version}', "
        f"callback = function(keys, args) made = made or make(); return made.{function}(keys, args) end"
        + (", flags = {'no-writes'}}" if function in READ_ONLY else "}")
        for function in FUNCTIONS
    ]
    return f"#!lua name={name}\n{body}\n" + "\n".join(registrations) + "\n", version


class Library:
    """The library on one client: its functions by name, loaded where a call finds them missing."""

    def __init__(
        self, client: redis.Redis, name: str = NAME, version: str | None = None, edit: dict[str, str] | None = None
    ):
        self.client, self.name = client, name
        self.text, self.version = source(name, version, edit)
        self._lock = threading.Lock()
        self.fold, self.pull, self.register = self._function("fold"), self._function("pull"), self._function("register")
        self.claim, self.restore, self.lease = (
            self._function("claim"),
            self._function("restore"),
            self._function("lease"),
        )

    def _function(self, function: str) -> Function:
        return Function(self, f"{self.name}_{function}_{self.version}", read_only=function in READ_ONLY)

    def load(self) -> None:
        """``FUNCTION LOAD REPLACE``: ours in place of any other version (on every primary of a
        Cluster). A typed error where the server is too old or the role may not load functions."""
        with self._lock:
            try:
                self.client.function_load(self.text, replace=True)
            except redis.exceptions.NoPermissionError as e:
                raise errors.PermissionDenied(
                    f"this role may not load redisync's functions ({e}): grant it +function|load, or connect once "
                    f"with a role that may (deploy/users.acl: the learner), so that library {self.version} is on the server"
                ) from e
            except redis.ResponseError as e:
                if "unknown command" in str(e).lower() or "unknown subcommand" in str(e).lower():
                    raise errors.UnsupportedServer(
                        f"the server has no Redis Functions ({e}): redisync needs {MINIMUM_SERVER}"
                    ) from e
                raise

    def unload(self) -> None:
        """``FUNCTION DELETE``: for a library of a name of its own (the stage profiler's cuts)."""
        try:
            self.client.function_delete(self.name)
        except redis.ResponseError as e:  # (never loaded: nothing to delete)
            if "not found" not in str(e).lower():
                raise


def missing(error: BaseException) -> bool:
    """Whether ``error`` says the function called is not on the server."""
    text = str(error).lower()
    return "function not found" in text or "no such function" in text


class Function:
    """One function of the library: ``function(keys=..., args=...)``, by FCALL (FCALL_RO for the
    read-only pull, so that a role that may only read the run can call it)."""

    def __init__(self, library: Library, name: str, read_only: bool):
        self.library, self.name, self.read_only = library, name, read_only

    def __call__(self, keys: list[str], args: list[Any], client: Any = None) -> Any:
        target = client if client is not None else self.library.client
        try:
            return self.send(target, keys, args)
        except redis.ResponseError as e:
            if not self.unsupported(e) and not missing(e):
                raise
        self.library.load()
        return self.send(target, keys, args)

    def send(self, target: Any, keys: list[str], args: list[Any]) -> Any:
        """Call the function (loading the library first when the server lacks it)."""
        call = target.fcall_ro if self.read_only else target.fcall
        return call(self.name, len(keys), *keys, *args)

    @staticmethod
    def unsupported(error: BaseException) -> bool:
        """An FCALL the server does not know: loading tells why (too old a server) in a typed error."""
        return "unknown command" in str(error).lower()
