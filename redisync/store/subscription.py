"""Following a run's versions channel: every fold announces ``<fleet_version> <epoch>`` on it.

The folds announce on the run's shard channel (SPUBLISH: on a Cluster the message stays on the
run's shard), and on the plain channel where their role may not SPUBLISH; a `Subscription`
follows both (the shard channel only while its role may: an ACL of an earlier redisync). A
connection that carries nothing for ``keepalive_s`` is sent a PING; one that does not answer within
another ``keepalive_s`` is taken for dead (a firewall or NAT that forgot an idle connection closes
nothing: without the PING a follower would wait for ever, subscribed in name).
"""

from __future__ import annotations

import time
from typing import Any, cast

import redis

from .codec import as_text
from .connection import Connection

SUBSCRIBED, ANNOUNCED = "subscribed", "announced"


class Subscription:
    """One connection following the run's versions channel. `next` says what it heard."""

    def __init__(self, store: Connection, shard_channel: bool, keepalive_s: float):
        client = cast(Any, store.redis)  # (pubsub() is annotated in some redis-py versions only)
        self._cluster = hasattr(client, "get_node_from_key")  # a RedisCluster: shard channels have their own reader
        self._channel, self._shard_channel, self._keepalive_s = store.keys.channel, shard_channel, keepalive_s
        self._pubsub = client.pubsub()
        self._awaited = 2 if shard_channel else 1  # confirmations before the subscription counts
        self._heard = time.monotonic()
        self._pinged: float | None = None

    def open(self) -> None:
        """Subscribe to the channels (confirmed later: `next` says ``subscribed``)."""
        if self._shard_channel:
            self._pubsub.ssubscribe(self._channel)
        self._pubsub.subscribe(self._channel)
        self._heard, self._pinged = time.monotonic(), None

    def next(self) -> tuple[str, Any] | None:
        """What came within 0.2 s: ``(SUBSCRIBED, None)`` once every channel is confirmed (nothing is
        missed from then on), ``(ANNOUNCED, message)`` with the message's text, or None. Raises
        ``ConnectionError`` when a PING went unanswered, and the client's errors as they come."""
        pubsub = self._pubsub
        if self._cluster and self._shard_channel:
            msg = pubsub.get_sharded_message(timeout=0.2) or pubsub.get_message(timeout=0.0)
        else:
            msg = pubsub.get_message(timeout=0.2)
        now = time.monotonic()
        if msg:
            self._heard, self._pinged = now, None  # anything at all: the connection lives
        elif self._pinged is None and now - self._heard >= self._keepalive_s:
            pubsub.ping()
            self._pinged = now
        elif self._pinged is not None and now - self._pinged >= self._keepalive_s:
            raise ConnectionError(f"the subscription answered no PING within {self._keepalive_s:g} s")
        kind = msg.get("type") if msg else None
        if kind in ("subscribe", "ssubscribe"):
            self._awaited -= 1
            return (SUBSCRIBED, None) if self._awaited == 0 else None
        if kind in ("message", "smessage"):
            assert msg is not None
            return ANNOUNCED, as_text(msg["data"])
        return None

    def close(self) -> None:
        """Close the connection (whatever state it is in)."""
        self._pubsub.close()

    @staticmethod
    def shard_channel_refused(error: BaseException) -> bool:
        """Whether ``error`` is the server refusing the shard channel (a role without SSUBSCRIBE)."""
        denied = isinstance(error, redis.exceptions.NoPermissionError) or "noperm" in str(error).lower()
        return denied and "ssubscribe" in str(error).lower()
