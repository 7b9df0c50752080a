"""The server under a store, for measuring it (``redisync bench``), never for running a fleet.

A measurement needs what the store's protocol does not say: the server's own figures (CPU seconds,
the slow log's time per command, each key's memory) and a raw client for the designs the protocol
is measured against (a client-side WATCH/MULTI fold, plain HSET and GET, a function that does
nothing, a script that reads the server's clock). They are here, behind `Connection.server`, so that
the store's modules stay the only ones that talk to Redis; nothing of the collectors, the learner
or the operators' tools uses them.
"""

from __future__ import annotations

import statistics
from typing import Any, cast

import redis

from .. import errors

WatchError = redis.WatchError
"""A WATCHed key changed before EXEC (the client-side fold's retry)."""
ClientError = redis.RedisError
"""What a raw client raises (a shard's calls raise the store's typed errors instead)."""


class SlowLog:
    """Server time per command from SLOWLOG (every command logged while it is on): medians, which a
    preemption of the server on a shared machine moves far less than INFO commandstats' mean. It
    changes the server's slow-log settings until `close` (a server of the measurement's own)."""

    def __init__(self, client: redis.Redis, calls: int):
        # its own client, the entries raw: a fold's arguments are binary, which redis-py would decode
        self.redis, self.calls = redis.Redis(connection_pool=client.connection_pool), calls
        self.redis.set_response_callback("SLOWLOG GET", lambda response, **options: response)
        self.saved: dict[Any, Any] | None
        try:
            self.saved = self.redis.config_get("slowlog-*")
            self.redis.config_set("slowlog-log-slower-than", 0)
            self.redis.config_set("slowlog-max-len", max(128, 2 * calls))
        except redis.ResponseError:  # the embedded store has no SLOWLOG
            self.saved = None

    def reset(self) -> None:
        """Forget the entries logged so far."""
        if self.saved is not None:
            self.redis.slowlog_reset()

    def median_us(self, *commands: str) -> float | None:
        """Median duration of the entries of ``commands`` (e.g. FCALL, FCALL_RO) logged since the
        last reset (None without a slow log, or with no such entry)."""
        if self.saved is None:
            return None
        entries = cast(Any, self.redis).execute_command("SLOWLOG GET", 2 * self.calls)  # [id, time, us, args, ...]
        names = {c.encode() for c in commands}
        took = [int(e[2]) for e in entries if bytes(e[3][0]).upper() in names]
        return float(statistics.median(took)) if took else None

    def close(self) -> None:
        """Put the server's slow-log settings back."""
        if self.saved is not None:
            for name, value in self.saved.items():
                self.redis.config_set(str(name), str(value))


class Server:
    """One store's server, as a measurement sees it (see the module)."""

    def __init__(self, client: redis.Redis):
        self._client = client

    @property
    def client(self) -> Any:
        """A raw client of the server: for the designs a measurement compares the store against."""
        return self._client

    def ping(self) -> None:
        """One PING (the round trip every other figure is set beside)."""
        self._client.ping()

    def cpu_s(self) -> float:
        """The CPU seconds the server has used (``INFO cpu``: system and user)."""
        info = self._client.info("cpu")
        return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    def memory_by_key(self, pattern: str) -> dict[str, int]:
        """``MEMORY USAGE`` of each key matching ``pattern``, by name."""
        return {
            key.decode(): int(self._client.memory_usage(key, samples=0) or 0)
            for key in self._client.scan_iter(match=pattern, count=1000)
        }

    def slow_log(self, calls: int) -> SlowLog:
        """The slow log, on for every command (`SlowLog`); ``calls``: how many entries it keeps, doubled."""
        return SlowLog(self._client, calls)

    def subscriber(self, channel: str) -> Any:
        """A connection of its own subscribed (``SSUBSCRIBE``) to ``channel``, as a collector's listener is.

        Its own pool of one, not the store's: a measurement holds hundreds of subscribers at once, and
        the store's pool is bounded (redis-py's default, 100), so from it the 101st would fail with
        "Too many connections" however many the machine and the server allow. A limit that does stop
        it (the open-file limit, the server's ``maxclients``) is a `ConnectionUnavailable` naming it."""
        pool = self._client.connection_pool
        own = redis.Redis(connection_pool=type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs))
        pubsub = own.pubsub()
        try:
            pubsub.ssubscribe(channel)
        except (redis.ConnectionError, OSError) as error:
            pubsub.close()
            own.close()
            raise errors.ConnectionUnavailable(f"a subscriber could not connect: {error}") from error
        return pubsub
