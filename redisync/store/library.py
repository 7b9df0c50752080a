"""The store's Lua as one Redis Functions library, loaded once per server and called by ``FCALL``.

A library keeps what its code makes for the life of the server's Lua VM: the fold's helpers are
made once when it loads, not at every call as an EVAL script makes them, and the server's own
identity is read once per VM (a restarted server starts a new VM). Every function's name carries
the library's version (``redisync_fold_<version>``), and so does the library's own name
(``redisync_<version>``): any number of redisync versions share one server or Cluster (teams, rolling
upgrades), each calling its own functions; loading one never removes another. A client that finds its
version missing (never loaded, a flush, a node that never had it) loads it and calls again; an
operator lists and prunes the versions on a server (``redisync functions``).

The library is ``lua/*.lua`` in one text: ``shared.lua`` (what the fold and the semantics share),
``lifecycle.lua`` (who has left a key that keeps a slot per shard: the fold's envelope judges it and
hands it to the semantics), ``exact.lua`` (exact sums as canonical planes, merge's arithmetic), then
each semantics' module (``lua/semantics/<name>.lua``, one per entry of the registry in
`redisync.store.semantics`) in a table ``SEMANTICS`` by name, then each function's file in a block
of its own. ``struct.lua``, the pure-Lua stand-in for Redis' C ``struct`` library, goes in as well
and serves where the server has no ``struct`` (the embedded fakeredis server): the same library runs
on both.

Needs Redis 7.0 or later (or Valkey); an older server is refused with a typed error naming it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import threading
from dataclasses import dataclass
from typing import Any

import redis

from .. import errors
from .codec import as_text
from .semantics import SEMANTICS

_LUA = importlib.resources.files("redisync.store") / "lua"
NAME = "redisync"
FUNCTIONS = ("fold", "pull", "register", "claim", "restore", "lease", "announce", "leases")
READ_ONLY = {"pull", "leases"}  # flagged no-writes: called by FCALL_RO
MINIMUM_SERVER = "Redis 7.0 or later (or Valkey 7.2 or later)"


def lua_files() -> list[str]:
    """The library's Lua files, by their path under ``lua/``: the envelope's and the functions', and
    one module per semantics of the registry."""
    return [
        "struct.lua",
        "clock.lua",
        "shared.lua",
        "lifecycle.lua",
        "exact.lua",
        "semantics/extremum.lua",
        *(f"semantics/{semantics}.lua" for semantics in SEMANTICS),
        *(f"{function}.lua" for function in FUNCTIONS),
    ]


def source(name: str | None = None, version: str | None = None, edit: dict[str, str] | None = None) -> tuple[str, str]:
    """The library's text and version. ``version`` defaults to the text's own digest; ``edit``
    replaces a file's text by its path under ``lua/`` (the stage profiler loads cut copies of the
    fold under a name and version of their own).

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
        _LUA.joinpath("struct.lua").read_text().rstrip("\n"),  # (read before the edits: never cut)
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
    texts = {path: _LUA.joinpath(path).read_text() for path in lua_files()}
    if set(edit or {}) - set(texts):
        raise ValueError(f"no Lua file {sorted(set(edit or {}) - set(texts))} in the library: {', '.join(texts)}")
    texts |= edit or {}
    lines += [
        "",
        "  -- clock.lua, the run's served clock (lease.lua and fold.lua)",
        texts["clock.lua"].rstrip(),
        "",
        "  -- shared.lua, what the fold's envelope and the semantics' modules share",
        texts["shared.lua"].rstrip(),
        "",
        "  -- lifecycle.lua, who has left a key with a slot per shard (fold.lua judges, the semantics folds)",
        "  local LIFECYCLE = (function()",
        texts["lifecycle.lua"].rstrip(),
        "  end)()",
        "",
        "  -- exact.lua, exact sums of float64 vectors as canonical planes (merge's arithmetic)",
        "  local EXACT = (function()",
        texts["exact.lua"].rstrip(),
        "  end)()",
        "",
        "  -- semantics/extremum.lua, what maximum's and minimum's modules share",
        texts["semantics/extremum.lua"].rstrip(),
        "",
        "  -- every semantics' module by name, from the registry (redisync/store/semantics): fold.lua,",
        "  -- pull.lua and register.lua find a key's module here by the name its key meta holds",
        "  local SEMANTICS = {}",
        "  local function no_reads() end",
    ]
    for semantics in SEMANTICS:
        lines += [
            "",
            f"  SEMANTICS['{semantics}'] = (function() -- semantics/{semantics}.lua",
            texts[f"semantics/{semantics}.lua"].rstrip(),
            "  end)()",
        ]
    lines += ["  for _, module in pairs(SEMANTICS) do module.reads = module.reads or no_reads end"]
    for function in FUNCTIONS:
        lines += ["", f"  do -- {function}.lua", texts[f"{function}.lua"].rstrip(), "  end"]
    lines += ["", "  return functions", "end"]
    body = "\n".join(lines) + "\n"
    version = version or hashlib.sha1(body.encode()).hexdigest()[:12]
    name = name or library_name(version)
    registrations = [
        f"redis.register_function{{function_name = '{NAME}_{function}_{version}', "
        f"callback = function(keys, args) made = made or make(); return made.{function}(keys, args) end"
        + (", flags = {'no-writes'}}" if function in READ_ONLY else "}")
        for function in FUNCTIONS
    ]
    return f"#!lua name={name}\n{body}\n" + "\n".join(registrations) + "\n", version


class Library:
    """The library on one client: its functions by name, loaded where a call finds them missing."""

    def __init__(
        self,
        client: redis.Redis,
        name: str | None = None,
        version: str | None = None,
        edit: dict[str, str] | None = None,
    ):
        self.client = client
        self.text, self.version = source(name, version, edit)
        self.name = name or library_name(self.version)
        self._lock = threading.Lock()
        self.fold, self.pull, self.register = self._function("fold"), self._function("pull"), self._function("register")
        self.claim, self.restore, self.lease, self.announce = (
            self._function("claim"),
            self._function("restore"),
            self._function("lease"),
            self._function("announce"),
        )
        self.leases = self._function("leases")

    def _function(self, function: str) -> Function:
        return Function(self, f"{NAME}_{function}_{self.version}", read_only=function in READ_ONLY)

    def load(self) -> None:
        """``FUNCTION LOAD REPLACE`` of this version's library (on every primary of a Cluster), beside
        any other version's. A typed error where the server is too old or the role may not load
        functions."""
        with self._lock:
            try:
                self.client.function_load(self.text, replace=True)
            except redis.exceptions.NoPermissionError as e:
                raise errors.PermissionDenied(
                    f"this role may not load redisync's functions ({e}): grant it +function|load, or connect once "
                    f"with a role that may (deploy/users.acl: the learner), so that library {self.version} is on the server"
                ) from e
            except redis.ResponseError as e:
                if "already exists" in str(e).lower():  # this version's functions, loaded under another
                    return  # library name (the single 'redisync' library of earlier versions): callable
                if "unknown command" in str(e).lower() or "unknown subcommand" in str(e).lower():
                    raise errors.UnsupportedServer(
                        f"the server has no Redis Functions ({e}): redisync needs {MINIMUM_SERVER}"
                    ) from e
                raise

    def gone(self, error: BaseException) -> errors.FunctionsMissing:
        """The typed error for a library that was loaded and is missing at once again."""
        return errors.FunctionsMissing(
            f"redisync's functions of version {self.version} are missing right after being loaded ({error}): "
            "something removes them as they are loaded (a FUNCTION FLUSH, a prune of this version: see "
            "'redisync functions list')"
        )

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
        try:
            return self.send(target, keys, args)
        except redis.ResponseError as e:
            if missing(e):
                raise self.library.gone(e) from e
            raise

    def send(self, target: Any, keys: list[str], args: list[Any]) -> Any:
        """Call the function. On a Cluster, straight to the primary of the run's slot (every key of a
        run shares it): left to redis-py, each call first asked another node (``COMMAND GETKEYS``,
        with the whole payload) which keys it carries, so a run depended on an unrelated node."""
        command = "FCALL_RO" if self.read_only else "FCALL"
        if keys and hasattr(target, "get_node_from_key"):  # a RedisCluster (MOVED and ASK still followed)
            node = target.get_node_from_key(keys[0])
            return target.execute_command(command, self.name, len(keys), *keys, *args, target_nodes=node)
        call = target.fcall_ro if self.read_only else target.fcall
        return call(self.name, len(keys), *keys, *args)

    @staticmethod
    def unsupported(error: BaseException) -> bool:
        """An FCALL the server does not know: loading tells why (too old a server) in a typed error."""
        return "unknown command" in str(error).lower()


def library_name(version: str) -> str:
    """The library of one redisync version on the server: ``redisync_<version>``."""
    return f"{NAME}_{version}"


@dataclass(frozen=True)
class LoadedLibrary:
    """One redisync library on a server: its name, its version, how many functions it holds."""

    name: str
    version: str
    functions: int


def loaded(client: redis.Redis) -> list[LoadedLibrary]:
    """redisync's libraries on the server (``FUNCTION LIST``), by name; the one library of
    redisync versions that loaded a single ``redisync`` library in place of the others included."""
    out = []
    for entry in client.function_list(library=f"{NAME}*") or []:
        fields = dict(zip(entry[::2], entry[1::2], strict=True))
        name = as_text(fields[b"library_name"] if b"library_name" in fields else fields["library_name"])
        if name != NAME and not name.startswith(NAME + "_"):
            continue
        functions = fields.get(b"functions") or fields.get("functions") or []
        names = [as_text(dict(zip(f[::2], f[1::2], strict=True)).get(b"name", b"")) for f in functions]
        versions = {n.rsplit("_", 1)[-1] for n in names if n.startswith(NAME + "_")}
        version = versions.pop() if len(versions) == 1 else name.removeprefix(NAME + "_")
        out.append(LoadedLibrary(name, version, len(names)))
    return sorted(out, key=lambda lib: lib.name)


def prune(client: redis.Redis, keep: set[str]) -> list[str]:
    """``FUNCTION DELETE`` every redisync library whose version is not in ``keep``; the names deleted."""
    gone = []
    for lib in loaded(client):
        if lib.version not in keep:
            try:
                client.function_delete(lib.name)
            except redis.ResponseError as e:  # (pruned by another call meanwhile: gone all the same)
                if "not found" not in str(e).lower():
                    raise
            gone.append(lib.name)
    return gone
