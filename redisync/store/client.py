"""The store client: the only module that talks to Redis.

``connect()`` gives a `Store` for one run, on a real Redis (``redis://``, ``rediss://``,
``unix://``) or on the embedded default: an in-process fakeredis server running the very
same Lua library (see ``library.py``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import logging
import os
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import redis
from pydantic import BaseModel, ConfigDict, ValidationError
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .. import errors
from . import codec, library
from .codec import as_text
from .keys import RunKeys
from .library import Function, Library
from .schema import Limits, Schema, encode_reports
from .semantics.base import first_error

ENV_URL = "REDISYNC_URL"
log = logging.getLogger("redisync.store")
EMBEDDED = "embedded"

_embedded_lock = threading.Lock()
_embedded_server: Any = None


def _embedded_client() -> redis.Redis:
    """A client of this process' embedded fakeredis server (one server per process)."""
    global _embedded_server
    import fakeredis

    with _embedded_lock:
        if _embedded_server is None:
            _embedded_server = fakeredis.FakeServer(version=(7, 0))
        return fakeredis.FakeRedis(server=_embedded_server)


@dataclass
class EmbeddedServer:
    """The embedded store served over TCP, so that several processes (collectors) can share it."""

    tcp: Any
    thread: threading.Thread

    @property
    def url(self) -> str:
        """The URL other processes reach the embedded store at."""
        host, port = self.tcp.server_address[:2]
        return f"redis://{host}:{port}/0"

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.tcp.shutdown()
        self.tcp.server_close()


def serve_embedded(host: str = "127.0.0.1", port: int = 0) -> EmbeddedServer:
    """Start an embedded server on ``host:port`` (0: a free port) in a background thread."""
    import fakeredis

    tcp = fakeredis.TcpFakeServer((host, port), server_version=(7, 0))
    tcp.daemon_threads = True
    thread = threading.Thread(target=tcp.serve_forever, name="redisync-embedded-server", daemon=True)
    thread.start()
    return EmbeddedServer(tcp, thread)


SENTINEL = "redis+sentinel://"
CLUSTER = "redis+cluster://"


def redis_client(url: str | None, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``url`` (None or 'embedded' for the embedded default), with retries."""
    if url is None or url == EMBEDDED:
        return _embedded_client()
    if not url.startswith(("redis://", "rediss://", "unix://", SENTINEL, CLUSTER)):
        raise errors.ConnectionUnavailable(
            f"unsupported URL {url!r}: use redis://, rediss://, unix://, redis+sentinel://, redis+cluster:// or leave it unset"
        )
    kwargs.setdefault("retry", Retry(ExponentialBackoff(cap=0.5, base=0.01), 3))
    kwargs.setdefault("retry_on_error", [redis.ConnectionError, redis.TimeoutError])
    kwargs.setdefault("socket_connect_timeout", 2.0)
    kwargs.setdefault("socket_timeout", 5.0)
    if url.startswith(SENTINEL):
        return _sentinel_client(url, **kwargs)
    if url.startswith(CLUSTER):
        client: redis.Redis = _cluster_client(url, **kwargs)  # (a RedisCluster answers the same calls)
        return client
    return redis.Redis.from_url(url, **kwargs)


def _cluster_client(url: str, **kwargs: Any) -> Any:
    """``redis+cluster://[user:password@]host:port[,host:port...]``: a Redis Cluster. Every key of a
    run carries the hash tag ``{run}``, so a run lives in one slot and every script runs on one node."""
    from urllib.parse import unquote, urlsplit

    from redis.cluster import ClusterNode, RedisCluster

    parts = urlsplit(url)
    creds, _, hosts = parts.netloc.rpartition("@")
    user, _, password = creds.partition(":")
    try:
        nodes = [
            cast(Any, ClusterNode)(
                h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1])
            )  # annotated in some redis-py versions only
            for h in hosts.split(",")
            if h
        ]
    except (ValueError, IndexError):
        nodes = []
    if not nodes:
        raise errors.ConnectionUnavailable(f"bad Cluster URL {url!r}: use redis+cluster://host:port[,host:port]")
    keep = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout", "retry") if k in kwargs}
    # require_full_coverage=False: a slot no node serves fails only the runs in it (redis-py's default
    # refuses every new client, for every run, while one slot is uncovered)
    try:  # (a RedisCluster reads the topology as it is made: a Cluster down fails here, untyped)
        return RedisCluster(
            startup_nodes=nodes,
            username=unquote(user) or None,
            password=unquote(password) or None,
            require_full_coverage=False,
            **keep,
        )
    except redis.exceptions.RedisClusterException as e:
        raise errors.ConnectionUnavailable(f"{masked_url(url)}: no node of the Cluster answers ({e})") from e


def server_time_us(client: Any) -> int:
    """The server's clock in microseconds (a cluster answers per node: any node will do)."""
    reply = client.time()
    if isinstance(reply, dict):
        reply = next(iter(reply.values()))
    sec, usec = reply
    return int(sec) * 1_000_000 + int(usec)


def _sentinel_client(url: str, **kwargs: Any) -> redis.Redis:
    """``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``: the service's
    current primary, followed across failovers by redis-py's Sentinel support."""
    from urllib.parse import unquote, urlsplit

    from redis.sentinel import Sentinel

    parts = urlsplit(url)
    creds, _, hosts = parts.netloc.rpartition("@")
    user, _, password = creds.partition(":")
    path = [p for p in parts.path.split("/") if p]
    try:
        nodes = [(h.rsplit(":", 1)[0], int(h.rsplit(":", 1)[1]) if ":" in h else 26379) for h in hosts.split(",") if h]
        db = int(path[1]) if len(path) > 1 else 0
    except ValueError:
        nodes, db = [], 0
    if not nodes or not path:
        raise errors.ConnectionUnavailable(
            f"bad Sentinel URL {url!r}: use redis+sentinel://host:port[,host:port]/service[/db]"
        )
    timeouts = {k: kwargs[k] for k in ("socket_timeout", "socket_connect_timeout") if k in kwargs}
    sentinel = cast(Any, Sentinel)(nodes, **timeouts)  # annotated from redis-py 8.2 on, not before
    return cast(
        redis.Redis,
        sentinel.master_for(
            path[0], db=db, username=unquote(user) or None, password=unquote(password) or None, **kwargs
        ),
    )


def connect(
    url: str | None = None,
    run: str = "default",
    *,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 1000,
    **redis_kwargs: Any,
) -> Store:
    """A store for ``run``: the handle a collector, the learner or a tool works through.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://`` or ``redis+cluster://``.
            ``None`` reads ``REDISYNC_URL``; unset, it is the embedded store (fakeredis in this
            process, for one process or a test).
        run: the run's name; every key of a run carries it as a hash tag (one Cluster slot per run).
        wait_replicas: a publish counts as done only once this many replicas hold it (``WAIT``):
            with it, a failover never loses an acknowledged report. Refused with a Cluster URL
            (``ConfigurationError``): there, ``WAIT`` would not reach the run's primary.
        wait_timeout_ms: how long that ``WAIT`` may take before the publish is refused.
        redis_kwargs: passed to redis-py's client (``socket_timeout``, ``ssl_ca_certs``, ...).
    """
    url = url if url is not None else os.environ.get(ENV_URL) or None
    if wait_replicas and url and url.startswith(CLUSTER):
        raise errors.ConfigurationError(
            f"wait_replicas={wait_replicas} with a Cluster URL ({masked_url(url)}): WAIT counts the writes of the "
            "connection it is sent on, and a Cluster client sends it to another node than the run's primary, so "
            "it would acknowledge nothing it waited for; use a Sentinel URL for acknowledged replication, or "
            "leave wait_replicas at 0"
        )
    store = Store(redis_client(url, **redis_kwargs), run, url=url or EMBEDDED)
    store.wait_replicas, store.wait_timeout_ms = wait_replicas, wait_timeout_ms
    if url:  # what another process needs to open the same store (a sidecar)
        store.connect_args = (url, {"wait_replicas": wait_replicas, "wait_timeout_ms": wait_timeout_ms, **redis_kwargs})
    return store


@dataclass(frozen=True)
class Registration:
    """What `Store.register` found: whether this call created the run, and the run's epoch."""

    created: bool
    epoch: str


class RunSnapshot(BaseModel):
    """A whole run, for a training checkpoint or a move between servers (JSON-safe, versioned).

    ``hashes`` maps each run hash (by its suffix after ``redisync:{run}:``) to its fields,
    every value base64 encoded since vectors are raw float64 bytes.
    """

    model_config = ConfigDict(extra="forbid")

    format: str = "redisync.snapshot"
    format_version: int = 1
    run: str
    taken_at_us: int
    hashes: dict[str, dict[str, str]]


def masked_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: what messages and logs may show."""
    return re.sub(r"(?<=://)([^:@/,]*):[^@/]*@", r"\1:***@", url)


def _denied(store: Store, error: Exception) -> errors.PermissionDenied:
    """The server's refusal, said in redisync's words: who may not do what, and where to grant it."""
    text = str(error)
    found = re.search(r"(?<=://)([^:@/,]+):", store.url)
    who = f"user {found.group(1)!r}" if found else "this connection (no user in the URL)"
    command = re.search(r"permissions to run the '([\w|]+)' command", text)
    if command:
        why = (
            f"{who} may not run {command.group(1).upper()} (its ACL lacks +{command.group(1)}; deploy/README.md's "
            "roles table says what each role may do)"
        )
    elif any(s in text for s in ("HELLO must be called", "NOAUTH", "Authentication required")):
        why = (
            "the server requires a user and password: put them in the URL (redis://user:password@host:port/db; "
            "deploy/users.acl defines a collector, a learner and an inspector)"
        )
    elif "invalid username-password pair" in text or "WRONGPASS" in text:
        why = f"the server refused {who}: wrong password, or the user is disabled"
    else:
        why = text
    return errors.PermissionDenied(f"{store.url}, run {store.run!r}: {why} (the server said: {text})")


@dataclasses.dataclass(frozen=True)
class LeaseReading:
    """A run's leases as an observer reads them (``leases.lua``): the server's time, the run's served
    clock (clock.lua's, not advanced by the read), the server's time at the run's last call, the
    stall cap, each shard's lease end in the served clock (-1: given up) and, for a shard that gave
    its lease up, why (`lifeline.stop_cause`: ``clean``, ``parent_exited``, ``terminated``)."""

    now_us: int
    served_us: int
    last_call_us: int | None
    stall_cap_us: int
    alive_until_us: dict[int, int]
    stopped: dict[int, str]


def _translated(method: Any) -> Any:
    """Redis failures as redisync's typed errors, naming the store's URL."""

    @functools.wraps(method)
    def call(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except (
            redis.exceptions.NoPermissionError,
            redis.exceptions.AuthenticationError,
            redis.exceptions.AuthorizationError,
        ) as e:  # before ConnectionError: some subclass it
            raise _denied(self, e) from e
        except redis.TimeoutError as e:  # (a black-hole address: no refusal, no answer)
            raise errors.ConnectionUnavailable(
                f"{self.url}: no answer in time ({e}): a wrong address or port, a firewall that drops the packets, "
                "or a server too busy to answer"
            ) from e
        except redis.ConnectionError as e:
            raise errors.ConnectionUnavailable(f"{self.url}: {e}") from e
        except (
            redis.exceptions.ClusterError,  # the cluster down (a primary failing over), redirects exhausted
            redis.exceptions.TryAgainError,  # a slot migrating
            redis.exceptions.SlotNotCoveredError,  # a slot no live node serves (while the topology settles)
            redis.exceptions.RedisClusterException,  # the others redis-py's cluster client raises untyped
        ) as e:  # a Cluster partly down: unavailable for this run, retried as any outage
            self._forget_connections()
            raise errors.ConnectionUnavailable(f"{self.url}: the Cluster cannot serve run {self.run!r} now: {e}") from e
        except (redis.exceptions.ReadOnlyError, redis.exceptions.BusyLoadingError) as e:  # a failover's passing states
            self._forget_connections()
            raise errors.ConnectionUnavailable(f"{self.url}: {e}") from e
        except redis.ResponseError as e:
            if "can't run this command" in str(e) or "NOPERM" in str(e):  # the ACL refused a command inside a script
                raise _denied(self, e) from e
            if any(state in str(e) for state in ("NOREPLICAS", "MASTERDOWN", "READONLY", "used with replica")):
                self._forget_connections()
                raise errors.ConnectionUnavailable(f"{self.url}: {e}") from e
            raise

    return call


def _checked_snapshot(snap: RunSnapshot) -> tuple[dict[str, dict[str, bytes]], Schema]:
    """The snapshot's hashes decoded, and its schema, after checking every hash and vector."""
    if snap.format != "redisync.snapshot" or snap.format_version != 1:
        raise errors.CorruptSnapshot(f"unsupported snapshot format {snap.format} v{snap.format_version}")

    def bad(where: str, what: str) -> errors.CorruptSnapshot:
        return errors.CorruptSnapshot(f"snapshot of run {snap.run!r}, {where}: {what}")

    hashes: dict[str, dict[str, bytes]] = {}
    for name, fields in snap.hashes.items():
        try:
            hashes[name] = {k: base64.b64decode(v, validate=True) for k, v in fields.items()}
        except ValueError:
            raise bad(f"hash {name!r}", "a field value is not base64") from None
    meta = hashes.get("meta")
    if not meta or "schema" not in meta or "digest" not in meta:
        raise bad("hash 'meta'", "missing, or without its schema and digest")
    try:
        schema = Schema.model_validate_json(meta["schema"])
    except ValueError as e:
        raise bad("the schema", str(e).splitlines()[0]) from None
    if as_text(meta["digest"]) != schema.digest:
        raise bad("hash 'meta'", "the digest does not match the schema")
    for field in ("fleet_version", "max_report_bytes", "stream_maxlen", "dead_letter_maxlen"):
        if not as_text(meta.get(field, b"")).isdigit():
            raise bad("hash 'meta'", f"{field} is missing or not a whole number")
    # the limits as the fold reads them, made from the fields beside it (a snapshot taken before the
    # field existed has none)
    dead_bytes = as_text(meta.get("dead_letter_max_bytes", b""))
    packed = as_text(meta.get("limits", b""))
    stall = Limits.unpacked(packed).stall_after_s if re.fullmatch(r"(\d+\|){5}\d+", packed) else None
    try:
        meta["limits"] = (
            Limits(
                max_report_bytes=int(meta["max_report_bytes"]),
                stream_maxlen=int(meta["stream_maxlen"]),
                dead_letter_maxlen=int(meta["dead_letter_maxlen"]),
                stream_payloads=as_text(meta.get("stream_payloads", b"0")) == "1",
                **({"dead_letter_max_bytes": int(dead_bytes)} if dead_bytes.isdigit() else {}),
                **({"stall_after_s": stall} if stall is not None else {}),
            )
            .packed()
            .encode()
        )
    except ValidationError as e:
        raise bad("hash 'meta'", f"the limits: {first_error(e)}") from None
    expected = {"meta", "shards"} | {f"{kind}:{name}" for name in schema.keys for kind in ("key", "data")}
    if set(hashes) - expected:
        raise bad("the hashes", f"unknown hashes {sorted(set(hashes) - expected)}")
    for name, spec in schema.keys.items():
        info = {k: as_text(v) for k, v in hashes.get(f"key:{name}", {}).items()}
        data = hashes.setdefault(f"data:{name}", {})
        if (
            info.get("semantics") != spec.semantics
            or info.get("width") != str(spec.width)
            or not info.get("version", "").isdigit()
        ):
            raise bad(f"key {name!r}", "its metadata is missing or does not match the schema")
        key_info = hashes[f"key:{name}"]
        for field, declared in spec.meta_fields(name).items():
            if field in info and info[field] != declared:
                raise bad(f"key {name!r}", f"{field} is {info[field]!r}, the snapshot's schema declares {declared!r}")
            key_info[field] = declared.encode()  # (an older snapshot without the field: the schema's)
        spec.check_stored(name, key_info, data, bad)
    return hashes, schema


class Store:
    """One run on one server: register its schema, hand out shard clients, read the fleet state."""

    def __init__(self, client: redis.Redis, run: str, url: str = EMBEDDED):
        self.redis = client
        self.keys = RunKeys(run)
        self.url = masked_url(url)  # only ever shown: messages, inspect, logs
        self.scripts = Library(client)
        self._schema: Schema | None = None
        self._pull_keys: list[str] = []
        self.wait_replicas, self.wait_timeout_ms = 0, 1000
        self.connect_args: tuple[str, dict[str, Any]] | None = None  # set by connect() for a server URL

    @property
    def run(self) -> str:
        """The run's name."""
        return self.keys.run

    def close(self) -> None:
        """Close this store's connections to the server, for a tool or a test done with the run (a
        later call opens new ones). Stores made by `sibling` share them."""
        self.redis.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    @_translated
    def schema(self) -> Schema:
        """The run's schema: the one registered through this store, else the one stored in Redis."""
        if self._schema is None:
            raw = self.redis.hget(self.keys.meta, "schema")
            if raw is None:
                raise errors.RunNotFound(f"run {self.run!r} is not registered")
            self._adopt(Schema.model_validate_json(raw))
        assert self._schema is not None
        return self._schema

    def _forget_connections(self) -> None:
        """After a failover, pooled connections may point at a node that became a replica: drop them,
        so that the next call asks Sentinel for the primary again."""
        pool = getattr(self.redis, "connection_pool", None)
        if pool is not None:
            pool.disconnect()

    @_translated
    def _call(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        return script(keys=keys, args=args)

    @_translated
    def _call_read_only(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """A read-only function (FCALL_RO), whose keys the server checks for reading only: a role
        that may read the run and write nothing (the inspector) can call it."""
        return script(keys=keys, args=args)

    def sibling(self, run: str) -> Store:
        """Another run on the same server, through the same connections and settings."""
        other = Store(self.redis, run)
        other.url = self.url
        other.wait_replicas, other.wait_timeout_ms, other.connect_args = (
            self.wait_replicas,
            self.wait_timeout_ms,
            self.connect_args,
        )
        return other

    @_translated
    def subruns(self) -> list[str]:
        """The sub-runs of this run when it is split over several primaries (`split`), in order;
        empty for a run that is not split (one HGET, which every role may run)."""
        names = self.redis.hget(self.keys.meta, "subruns")
        return list(as_text(names).split(",")) if names else []

    @_translated
    def split(self, names: Sequence[str]) -> list[str]:
        """Split this run into the sub-runs ``names`` (shard ``k`` publishes to ``names[k % len]``),
        unless it is split already: returns the split in force, which never changes in the run's
        life. An aggregator per sub-run (`redisync.aggregation.Aggregator`) makes this run the sum
        of them; a split is made before the run's collectors start."""
        if not names:
            raise errors.ConfigurationError(f"run {self.run!r}: a split needs at least one sub-run")
        for name in names:
            RunKeys(name)  # a bad name: InvalidSchema, before anything is written
        if len(set(names)) != len(names) or self.run in names:
            raise errors.ConfigurationError(f"run {self.run!r}: sub-runs must differ from each other and from it")
        in_force: list[str] = self.subruns()
        if in_force:
            return in_force
        if self.registered():
            raise errors.ConfigurationError(
                f"run {self.run!r} is registered already and not split (its collectors publish to it): split a run "
                "before its collectors start, or name a new one"
            )
        self.redis.hsetnx(self.keys.meta, "subruns", ",".join(names))
        split: list[str] = self.subruns()
        return split

    @_translated
    def shard_ids(self) -> set[int]:
        """Every shard id that has claimed or folded in the run's current life."""
        fields = (as_text(f) for f in self.redis.hkeys(self.keys.shards))
        return {int(f[: -len(":incarnation")]) for f in fields if f.endswith(":incarnation")}

    def home(self, shard_id: int) -> Store:
        """Where shard ``shard_id`` publishes: this run, or its sub-run when the run is split."""
        names = self.subruns()
        return self.sibling(names[shard_id % len(names)]) if names else self

    @_translated
    def announce_owed(self) -> bool:
        """Announce the run's current version if a fold left its announcement owed (a run with
        ``Limits.announce_every_s``) and the window since the last announcement has passed; False
        when nothing was announced (nothing owed, or the window not over: `owed_wait_s` says)."""
        paid: bool = self.owed_wait_s() == 0.0
        return paid

    @_translated
    def owed_wait_s(self) -> float | None:
        """Pay an owed announcement: 0.0 when it announced now, None when nothing was owed, else the
        seconds left of the window (the debt stays; any client may pay it then)."""
        reply = self._call(self.scripts.announce, [self.keys.meta], [])
        if isinstance(reply, list):  # ['wait', µs]
            return max(int(as_text(reply[1])), 1) / 1e6
        return 0.0 if int(reply) == 1 else None

    def _pay_later(self, delay_us: int) -> None:
        """Announce what a fold left owed once the run's window has passed, from a timer thread (again
        when the server says the window is not over yet): a follower learns a burst's last version then.
        If this process is gone by then, the debt stays in the run's meta for any client to pay, and
        each follower that heard the window open looks once when it closes."""

        def pay() -> None:
            try:
                wait = self.owed_wait_s()
            except errors.RedisyncError as e:
                log.info(
                    "run %r: an owed announcement was not made (%s); followers' polls find the version", self.run, e
                )
                return
            if wait:  # (the window not over by the server's clock)
                later = threading.Timer(wait, pay)
                later.daemon = True
                later.start()

        timer = threading.Timer(delay_us / 1e6, pay)
        timer.daemon = True
        timer.start()

    @_translated
    def registered(self) -> bool:
        """Whether the run is registered on the server (one HGET, which every role may run)."""
        return self.redis.hget(self.keys.meta, "epoch") is not None

    @_translated
    def load_functions(self) -> None:
        """Load redisync's Redis Functions library onto the server (every primary of a Cluster). The
        first call that finds it missing loads it anyway; a deployment whose collectors may not load
        functions (deploy/users.acl) runs this once per server and redisync version with a role that
        may, e.g. the learner's."""
        self.scripts.load()

    @_translated
    def functions(self) -> list[library.LoadedLibrary]:
        """redisync's function libraries on the server, one per version (this one's is
        ``store.scripts.version``)."""
        return library.loaded(self.redis)

    @_translated
    def prune_functions(self, keep: Iterable[str] = ()) -> list[str]:
        """Delete every redisync version's library from the server but this one's and ``keep``'s
        (retire old versions once no collector runs them); the libraries deleted."""
        return library.prune(self.redis, {self.scripts.version, *keep})

    @_translated
    def ping(self) -> None:
        """Reach the server now (connections are otherwise opened lazily): a typed error naming the
        URL and the cause when it does not answer, or refuses the URL's database or credentials."""
        try:
            self.redis.ping()
        except redis.exceptions.NoPermissionError:
            raise  # PermissionDenied, from the decorator
        except redis.ResponseError as e:  # raised while connecting, e.g. SELECT of a database the server lacks
            hint = " (the server has fewer databases: see its 'databases' setting)" if "DB index" in str(e) else ""
            raise errors.ConnectionUnavailable(f"{self.url}: {e}{hint}") from e

    @_translated
    def _call_replicated(self, script: Any, keys: list[str], args: list[Any]) -> tuple[Any, int]:
        """The script and a WAIT on one connection: the reply and how many replicas hold the write."""

        def send() -> tuple[Any, int]:
            pipe = self.redis.pipeline(transaction=False)
            script(keys=keys, args=args, client=pipe)
            pipe.wait(self.wait_replicas, self.wait_timeout_ms)
            reply, acked = pipe.execute()
            return reply, int(acked)

        try:
            return send()
        except redis.ResponseError as e:
            if not (library.missing(e) or Function.unsupported(e)):
                raise
        script.library.load()  # the library was not there (a flush, a node that never had it): ours, then again
        try:
            return send()
        except redis.ResponseError as e:
            if library.missing(e):
                raise script.library.gone(e) from e
            raise

    def _key_hashes(self, schema: Schema) -> list[str]:
        """KEYS of the pull and register scripts: the run's meta, then meta and data of every key."""
        out = [self.keys.meta]
        for name in schema.keys:
            out += [self.keys.key_meta(name), self.keys.key_data(name)]
        return out

    def register(self, schema: Schema | Mapping[str, Any], limits: Limits | None = None) -> Registration:
        """Store the run's schema (the first registration wins) or check ours against it.

        Args:
            schema: ``{key: spec}`` (`merge`, `broadcast`, `maximum`) or a
                `Schema`.
            limits: the run's size limits (`Limits`; the defaults suit fleet reports).

        Raises:
            SchemaMismatch: the run holds another schema, naming the key that differs.
        """
        schema = schema if isinstance(schema, Schema) else Schema.of(schema)
        limits = limits or Limits()
        args: list[Any] = [
            schema.canonical_json(),
            schema.digest,
            secrets.token_hex(8),
            limits.max_report_bytes,
            limits.stream_maxlen,
            limits.dead_letter_maxlen,
            int(limits.stream_payloads),
            limits.dead_letter_max_bytes,
            limits.packed(),
            limits.announce_every_us,
        ]
        for name, spec in schema.keys.items():
            meta, data = spec.meta_fields(name) | spec.initial_meta(), spec.initial_data()
            args += [name, spec.semantics, len(meta), len(data)]
            args += [x for pair in meta.items() for x in pair] + [x for pair in data.items() for x in pair]
        reply = self._call(self.scripts.register, self._key_hashes(schema), args)
        if as_text(reply[0]) == "unknown_semantics":
            raise errors.InvalidSchema(
                f"key {as_text(reply[1])!r}: {as_text(reply[2])} (a newer redisync registered it?)"
            )
        if as_text(reply[0]) == "no_info":
            raise errors.PermissionDenied(
                f"{self.url}, run {self.run!r}: this role may not run INFO ({as_text(reply[1])}); redisync needs it to tell a "
                "restarted server from the same one (a restart that lost writes opens a new epoch): grant +info "
                "(deploy/users.acl does)"
            )
        status, epoch, registered = reply
        if as_text(status) == "mismatch":
            theirs = Schema.model_validate_json(registered)
            key, difference = schema.difference(theirs) or (None, "schema digest differs")
            raise errors.SchemaMismatch(key, difference)
        self._adopt(schema)
        return Registration(created=as_text(status) == "created", epoch=as_text(epoch))

    def _adopt(self, schema: Schema) -> None:
        self._schema = schema
        self._pull_keys = self._key_hashes(schema)

    @_translated
    def limits(self) -> Limits:
        """The run's size limits, as registered."""
        raw = self.redis.hmget(
            self.keys.meta,
            "max_report_bytes",
            "stream_maxlen",
            "dead_letter_maxlen",
            "stream_payloads",
            "dead_letter_max_bytes",
            "limits",
            "announce_every_us",
        )
        if raw[0] is None or raw[1] is None or raw[2] is None:
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        window = {"announce_every_s": int(raw[6]) / 1e6} if raw[6] is not None else {}
        with contextlib.suppress(ValueError):  # (a run registered before the field: its fields one by one)
            return Limits.unpacked(as_text(raw[5] or b"")).model_copy(update=window)
        return Limits(
            **window,
            max_report_bytes=int(raw[0]),
            stream_maxlen=int(raw[1]),
            dead_letter_maxlen=int(raw[2]),
            stream_payloads=raw[3] == b"1",
            **({} if raw[4] is None else {"dead_letter_max_bytes": int(raw[4])}),
        )

    def shard(
        self,
        shard_id: int,
        incarnation: int | None = None,
        *,
        resume: bool | Iterable[str] = False,
        reserve: Callable[[int], None] | None = None,
    ) -> ShardClient:
        """The client of collector ``shard_id``. Without ``incarnation`` it claims a new one from the
        server at its first call; ``resume`` names the keys (True: all) this process resumed from a
        checkpoint holding its own cumulative statistics, whose previous slots it takes over;
        ``reserve`` is called with each sequence number before its fold is sent."""
        return ShardClient(self, shard_id, incarnation, resume=resume, reserve=reserve)

    @_translated
    def claim(self, shard_id: int, take_over: bool = True) -> int:
        """A new incarnation of ``shard_id``, issued by the server and above every earlier claim.
        Without ``take_over`` a shard whose holder's lease is fresh (a live process) is refused
        with `ShardInUse`."""
        reply = self._call(self.scripts.claim, [self.keys.meta, self.keys.shards], [shard_id, int(take_over)])
        if as_text(reply[0]) == "no_run":
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        if as_text(reply[0]) == "in_use":
            raise errors.ShardInUse(shard_id, as_text(reply[1]), int(as_text(reply[2])))
        return int(as_text(reply[1]))

    @_translated
    def lease(self, shard_id: int, incarnation: int, lease_ms: int, stop_cause: str = "clean") -> bool:
        """Renew ``incarnation``'s lease on ``shard_id`` (0 ms: give it up, recording ``stop_cause``:
        `lifeline.stop_cause`); False when a later process has claimed the shard."""
        args = [shard_id, incarnation, lease_ms] + ([stop_cause] if lease_ms == 0 else [])
        reply = self._call(self.scripts.lease, [self.keys.shards, self.keys.meta], args)
        return as_text(reply[0]) == "leased"

    @_translated
    def leases(self) -> LeaseReading:
        """The run's leases as the fold judges them, read without advancing its served clock (an
        observer's read: the inspector role may make it)."""
        reply = self._call_read_only(self.scripts.leases, [self.keys.shards, self.keys.meta], [])
        if as_text(reply[0]) == "no_run":
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        now, served, wall, cap = (as_text(v) for v in reply[1:5])
        rows = [as_text(v) for v in reply[5:]]
        triples = [rows[i : i + 3] for i in range(0, len(rows), 3)]
        return LeaseReading(
            now_us=int(now),
            served_us=int(served),
            last_call_us=int(wall) if wall else None,
            stall_cap_us=int(cap),
            alive_until_us={int(shard): int(until) for shard, until, _ in triples},
            stopped={int(shard): why for shard, until, why in triples if int(until) < 0 and why},
        )

    def pull(
        self,
        shard_id: int | None = None,
        known: codec.PullResult | None = None,
        incarnation: int | None = None,
        resumed: Any = lambda name: False,
        check_first: bool = False,
    ) -> codec.PullResult | None:
        """The state changed since ``known`` (all of it when None), with the slots of ``shard_id``'s
        ``incarnation`` (and of its previous life where its next fold takes them out: see ``parse_pull``).

        ``check_first``: read the run's epoch and fleet version first (one plain HMGET, about a PING)
        and call the pull function only when they moved: for a poll that expects no change. A caller
        that knows the state moved (an announcement on the versions channel) leaves it off."""
        schema = self.schema
        if check_first and known is not None and self._version() == codec.version_reply(known):
            return None
        args: list[Any] = ["" if shard_id is None else shard_id]
        if known is None:
            args += ["", -1] + [-1] * len(schema.keys)
        else:
            args += [known.epoch, known.fleet_version] + [
                known.keys[n].version if n in known.keys else -1 for n in schema.keys
            ]
        reply = self._call_read_only(self.scripts.pull, self._pull_keys, args)
        return codec.parse_pull(reply, schema, None if known is None else known.epoch, incarnation, resumed)

    @_translated
    def _version(self) -> Any:
        """The run's epoch and fleet version as stored (bytes; None where missing): one plain read."""
        return cast(Any, self.redis).execute_command(
            "HMGET", self.keys.meta, "epoch", "fleet_version"
        )  # annotated in some redis-py versions only

    def fleet(self) -> codec.PullResult:
        """The whole fleet state, read-only (for the learner, logging and inspection)."""
        result = self.pull()
        assert result is not None
        return result

    @_translated
    def key_info(self, name: str) -> dict[str, str]:
        """The readable metadata of one key (what ``redis-cli HGETALL`` shows)."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.key_meta(name)).items()}

    @_translated
    def key_vectors(self, name: str) -> dict[str, bytes]:
        """The stored vectors of one key (its data hash: what its semantics' module reads)."""
        data = self.redis.hgetall(self.keys.key_data(name))
        return {as_text(k): v for k, v in data.items() if isinstance(v, bytes)}

    @_translated
    def run_info(self) -> dict[str, str]:
        """The run's metadata hash: epoch, fleet version, times."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.meta).items()}

    @_translated
    def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest rejected reports, newest first, with reason, key and detail as text."""
        out = []
        for entry_id, fields in self.redis.xrevrange(self.keys.dead_letters, count=count) or []:
            row: dict[str, Any] = {"id": as_text(entry_id)}
            for k, v in (fields or {}).items():
                k = as_text(k)
                row[k] = v if k.startswith("report:") else as_text(v)
            out.append(row)
        return out

    # ------------------------------------------------------------------ checkpoints

    def _hash_names(self) -> list[str]:
        return ["meta", "shards"] + [f"{kind}:{name}" for name in self.schema.keys for kind in ("key", "data")]

    @_translated
    def snapshot(self) -> RunSnapshot:
        """The whole run's state, read in one transaction."""
        names = self._hash_names()
        pipe = self.redis.pipeline(transaction=True)
        for n in names:
            pipe.hgetall(self.keys.prefix + n)
        hashes = pipe.execute()
        if not hashes[0]:
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        return RunSnapshot(
            run=self.run,
            taken_at_us=server_time_us(self.redis),
            hashes={
                n: {as_text(k): base64.b64encode(v).decode() for k, v in h.items()}
                for n, h in zip(names, hashes, strict=False)
            },
        )

    @_translated
    def restore(self, snap: RunSnapshot) -> str:
        """Replace the run's state by ``snap`` under a new epoch, atomically; returns the epoch.

        Every hash and vector is checked before anything is written (a bad snapshot raises
        `CorruptSnapshot` and leaves the run as it was). Versions continue
        from the larger of the current and the snapshot's, so no client ever sees a version go back;
        the new epoch tells every client to take the full state. Shards the run knows keep their
        current incarnation, so live collectors keep publishing: a slot of theirs from another
        incarnation in the snapshot is their previous life (retired or dropped by the key's
        lifecycle, or taken over on resume) at their next fold.
        """
        hashes, schema = _checked_snapshot(snap)
        self._adopt(schema)
        names = self._hash_names()
        args: list[Any] = [secrets.token_hex(8)]
        for n in names:
            fields = hashes.get(n, {})
            args.append(len(fields))
            for k, v in fields.items():
                args += [k, v]
        self._call(self.scripts.restore, [self.keys.prefix + n for n in names], args)
        return as_text(args[0])

    @_translated
    def last_folded_seq(self, shard_id: int, incarnation: int) -> int:
        """The last sequence number folded for ``shard_id`` under ``incarnation`` (0 if none)."""
        inc, seq = self.redis.hmget(self.keys.shards, f"{shard_id}:incarnation", f"{shard_id}:seq")
        return int(seq) if inc is not None and seq is not None and int(inc) == incarnation else 0

    @_translated
    def delete(self) -> int:
        """Remove every key of the run (its state, streams and metadata)."""
        doomed = list(self.redis.scan_iter(match=self.keys.pattern, count=1000))
        return int(self.redis.delete(*doomed)) if doomed else 0


class ShardClient:
    """One collector's side of the store: publish its shard reports, pull the fleet state.

    Every publish takes the next sequence number, so a retry of the same call is recognised
    as a duplicate while a later, different report never is. Safe to share between threads:
    publishes are serialised, so folds arrive in sequence order.
    """

    def __init__(
        self,
        store: Store,
        shard_id: int,
        incarnation: int | None = None,
        *,
        resume: bool | Iterable[str] = False,
        reserve: Callable[[int], None] | None = None,
    ):
        if not isinstance(shard_id, (int, np.integer)) or isinstance(shard_id, bool) or not 0 <= shard_id < 10**9:
            raise errors.MalformedReport(None, f"shard_id must be an int in [0, 1e9), got {shard_id!r}")
        self.store = store
        self.shard_id = int(shard_id)
        # issued by the server at the first call unless given (claim()), so host clocks never order lives
        self._incarnation = int(incarnation) if incarnation is not None else None
        self.resume: bool | frozenset[str] = resume if isinstance(resume, bool) else frozenset(resume)
        self.seq = 0
        self.known: codec.PullResult | None = None
        self._polled: codec.PullResult | None = None  # the state a poll's expected reply was made for
        self._poll_reply: list[bytes] = []
        self.highest_version = 0  # the highest fleet version this client has seen, in any epoch
        self._continued_epoch: int | None = None  # epoch_tag of highest_version when continued from another process
        # called with each seq before its fold is sent (a sidecar records it for its successor)
        self.reserve = reserve
        self.take_over = True  # claim even while another live process holds the shard (a Syncer asks first)
        self._limits: Limits | None = None
        self._fold_keys: dict[tuple[str, ...], list[str]] = {}  # KEYS of the fold, per set of reported keys
        self._resume_flags: dict[tuple[str, ...], tuple[Any, str]] = {}  # (resume, its flags), per set of keys
        self._lock = threading.RLock()

    @property
    def incarnation(self) -> int:
        """This process' incarnation of the shard, claimed from the server on first use."""
        if self._incarnation is None:
            with self._lock:
                if self._incarnation is None:
                    self._incarnation = self.store.claim(self.shard_id, self.take_over)
        return self._incarnation

    @incarnation.setter
    def incarnation(self, value: int) -> None:
        """This process's incarnation of the shard, claimed from the server on first use."""
        self._incarnation = int(value)

    @property
    def claimed(self) -> bool:
        """Whether this process has claimed its incarnation yet (reading `incarnation` claims one)."""
        return self._incarnation is not None

    @property
    def claimed_incarnation(self) -> int | None:
        """The incarnation if claimed, else None (reading it never claims one)."""
        return self._incarnation

    def continue_from(self, epoch_tag: int, version: int) -> None:
        """Carry on from another process serving this shard (a restarted sidecar): the newest fleet
        state it handed over was ``version`` of the epoch with ``epoch_tag``
        (`redisync.store.codec.epoch_tag`), so an older state of that epoch is lost writes here too."""
        self.highest_version = max(self.highest_version, version)
        self._continued_epoch = epoch_tag

    def resumes(self, name: str) -> bool:
        """Whether this incarnation takes over its previous life's slot of ``key``."""
        return self.resume if isinstance(self.resume, bool) else name in self.resume

    def last_folded_seq(self) -> int:
        """The last sequence number the server folded for this incarnation (0 if none): where a new
        process serving the same incarnation (a restarted sidecar) continues."""
        seq: int = self.store.last_folded_seq(self.shard_id, self.incarnation)
        return seq

    def publish(self, reports: Mapping[str, Any]) -> codec.PublishResult:
        """Validate, then fold this shard's reports in one FCALL, all or nothing.

        Args:
            reports: ``{key: report}``: a merge key's ``{"count": ..., "sum": ...[, "sumsq": ...]}``
                (this shard's cumulative own values), a broadcast or maximum key's ``{"value": ...}``;
                numbers as Python scalars, numpy arrays or tensors.

        Returns:
            The fold's outcome: ``applied`` with the new fleet version, or ``duplicate`` for a retry.

        Raises:
            RedisyncError: a typed subclass naming the key and what is wrong (a bad shape, a value
                that is not finite, a writer that is not the owner, a stale incarnation, ...).
        """
        store = self.store
        if self._limits is None:
            self._limits = store.limits()
        payloads = encode_reports(store._schema or store.schema, reports, self._limits, self.shard_id)
        with self._lock:
            self.seq += 1
            if self.reserve is not None:
                self.reserve(self.seq)
            return self.publish_payloads(payloads, self.seq)

    def publish_payloads(self, payloads: Mapping[str, bytes], seq: int) -> codec.PublishResult:
        """Fold already-encoded payloads with an explicit ``seq`` (no client-side checks)."""
        store = self.store
        names = tuple(payloads)
        keys = self._fold_keys.get(names)
        if keys is None:
            keys = [store.keys.meta, store.keys.shards, store.keys.reports, store.keys.dead_letters]
            for name in names:
                keys += [store.keys.key_meta(name), store.keys.key_data(name)]
            self._fold_keys[names] = keys
        flags = self._resume_flags.get(names)
        if flags is None or flags[0] is not self.resume:  # (a Syncer may set resume after a restore)
            flags = self._resume_flags[names] = (self.resume, "".join("1" if self.resumes(n) else "0" for n in names))
        with self._lock:
            digest = (store._schema or store.schema).digest
            args: list[Any] = [digest, self.shard_id, self.incarnation, seq, self.highest_version, flags[1]]
            for name, payload in payloads.items():
                args += [name, payload]
            if not store.wait_replicas:
                result = codec.parse_publish(store._call(store.scripts.fold, keys, args), names)
                self.highest_version = max(self.highest_version, result.fleet_version)
                if result.owed_in_us is not None:
                    store._pay_later(result.owed_in_us)
                return result
            reply, acked = store._call_replicated(store.scripts.fold, keys, args)
            result = codec.parse_publish(reply, names)
            self.highest_version = max(self.highest_version, result.fleet_version)
            if result.owed_in_us is not None:
                store._pay_later(result.owed_in_us)
        if result.applied and acked < store.wait_replicas:
            raise errors.NotReplicated(
                f"{store.url}: fold {result.fleet_version} reached {acked} of {store.wait_replicas} replicas "
                f"within {store.wait_timeout_ms} ms; publish again"
            )
        return result

    def pull(self, check_first: bool = True) -> codec.PullResult | None:
        """The keys that changed since this shard's last pull, or None. One round trip when nothing
        changed (a plain read of the version), two when something did; ``check_first=False`` (the
        caller knows it changed: an announcement) makes that one.

        ``self.known`` keeps the whole fleet state as last seen (every key, latest version).
        """
        known = self.known
        if check_first and known is not None:  # (no lock: a poll that finds nothing costs one read, about a PING)
            if known is not self._polled:
                self._polled, self._poll_reply = known, codec.version_reply(known)
            if self.store._version() == self._poll_reply:
                return None
        with self._lock:
            result = self.store.pull(self.shard_id, self.known, self.incarnation, self.resumes)
            if result is not None:
                continued = self._continued_epoch
                same_epoch = not result.epoch_changed or (
                    self.known is None and continued is not None and codec.epoch_tag(result.epoch) == continued
                )
                self._continued_epoch = None
                if same_epoch and result.fleet_version < self.highest_version:
                    # same epoch, older version: the store lost its last writes (a crash between fsyncs)
                    result = dataclasses.replace(result, lost_writes=True)
                self.highest_version = max(self.highest_version, result.fleet_version)
                known = result
                if self.known is not None and not result.epoch_changed:
                    known = codec.PullResult(
                        result.epoch,
                        result.fleet_version,
                        False,
                        {**self.known.keys, **result.keys},
                        result.server_time_us,
                    )
                self.known = known
            return result
