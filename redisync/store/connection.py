"""The connection to a server and what every part of the store client shares.

The only module family that talks to Redis is the store client's (this module, `runs`, `protocol`,
`subscription`, `reads`, and `server` for measurements); this module holds the topology (standalone, Sentinel, Cluster, the
embedded server), the translation of the server's failures into redisync's typed errors, the
calls of the function library, and `Connection`, the base of `Store` with the run's schema and
limits that every concern reads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from .. import errors
from . import library
from .codec import as_text
from .keys import ROOT, RunKeys, run_of
from .library import Function, Library
from .schema import Limits, Schema
from .server import Server

ENV_URL = "REDISYNC_URL"
log = logging.getLogger("redisync.store")
EMBEDDED = "embedded"
ServerError = redis.RedisError  # a server's error that redisync does not translate (a caller may catch it)

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
    _check_port(url)
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


def bounded_calls(call_timeout_s: float | None, retries: int | None) -> dict[str, Any]:
    """redis-py settings for calls that wait at most ``call_timeout_s`` (and connections too) and are
    sent again ``retries`` times without back-off; None leaves the default."""
    out: dict[str, Any] = {}
    if call_timeout_s is not None:
        out |= {"socket_timeout": call_timeout_s, "socket_connect_timeout": call_timeout_s}
    if retries is not None:
        out["retry"] = Retry(NoBackoff(), retries)
    return out


def _check_port(url: str) -> None:
    """A URL whose port no TCP connection can use is refused, naming it (redis-py would raise an
    OverflowError from the socket at the first call)."""
    from urllib.parse import urlsplit

    for netloc in urlsplit(url).netloc.rpartition("@")[2].split(","):  # (Sentinel and Cluster URLs list several)
        port = netloc.rpartition(":")[2] if ":" in netloc and not netloc.endswith("]") else ""
        if port and (not port.isdigit() or not 0 < int(port) < 65536):
            raise errors.ConfigurationError(f"{masked_url(url)}: {port!r} is not a TCP port (1 to 65535)")


def server_at(url: str, **kwargs: Any) -> Server:
    """The server at ``url`` without a run, for measuring it (`redisync.store.server`): a design a
    bench compares the store against, a Cluster primary's CPU."""
    return Server(redis_client(url, **kwargs))


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


def masked_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: what messages and logs may show."""
    return re.sub(r"(?<=://)([^:@/,]*):[^@/]*@", r"\1:***@", url)


def _denied(store: Connection, error: Exception) -> errors.PermissionDenied:
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


def _translated(method: Any) -> Any:
    """Redis failures as redisync's typed errors, naming the store's URL."""

    @functools.wraps(method)
    def call(self: Connection, *args: Any, **kwargs: Any) -> Any:
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


class Connection:
    """One run on one server, as every concern of the store client sees it: the connections, the
    run's key names, its function library, its schema and its limits."""

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

    def __enter__(self) -> Connection:
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

    def _adopt(self, schema: Schema) -> None:
        self._schema = schema
        self._pull_keys = self._key_hashes(schema)

    def _key_hashes(self, schema: Schema) -> list[str]:
        """KEYS of the pull and register scripts: the run's meta, then meta and data of every key."""
        out = [self.keys.meta]
        for name in schema.keys:
            out += [self.keys.key_meta(name), self.keys.key_data(name)]
        return out

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
        except redis.exceptions.InvalidResponse as e:  # something that is not Redis answers on that port
            raise errors.ConnectionUnavailable(
                f"{masked_url(self.url)}: the server there does not speak Redis' protocol ({e}): is the port "
                "another service's (an HTTP server answers 'H...')?"
            ) from e

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

    # ------------------------------------------------------------------ the server, for the tools

    def server(self) -> Server:
        """This store's server, for measuring it (`redisync.store.server`), never for running a fleet."""
        return Server(self.redis)

    @_translated
    def server_time_us(self) -> int:
        """The server's clock now, in microseconds (the clock that stamps the slots)."""
        return server_time_us(self.redis)

    @_translated
    def run_names(self) -> list[str]:
        """The names of every run on the server (by their meta keys)."""
        found = {run_of(as_text(k)) for k in self.redis.scan_iter(match=f"{ROOT}:{{*}}:meta", count=1000)}
        return sorted(r for r in found if r)

    @_translated
    def run_epoch(self, run: str) -> bytes | None:
        """Run ``run``'s epoch as stored (None: not registered), one HGET on this server."""
        epoch = self.redis.hget(RunKeys(run).meta, "epoch")
        return epoch if isinstance(epoch, bytes) else None if epoch is None else epoch.encode()

    @_translated
    def primaries(self) -> list[str]:
        """A Cluster's primaries (host:port, sorted), as the client's slot map has them; [] elsewhere."""
        get_primaries = getattr(self.redis, "get_primaries", None)
        return sorted(node.name for node in get_primaries()) if callable(get_primaries) else []

    @_translated
    def primary_of(self, run: str) -> str:
        """The Cluster primary (host:port) that serves run ``run``'s slot, by the client's slot map (a slot
        no node serves while the topology settles: `ConnectionUnavailable`)."""
        node = cast(Any, self.redis).nodes_manager.get_node_from_slot(key_slot(run.encode()))
        return str(node.name)
