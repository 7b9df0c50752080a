"""The store client: ``connect()`` and `Store`, one run on one server.

``connect()`` gives a `Store` for one run, on a real Redis (``redis://``, ``rediss://``,
``unix://``) or on the embedded default: an in-process fakeredis server running the very
same Lua library (see ``library.py``). `Store` is one class made of one module per concern, and
they alone talk to Redis:

- `redisync.store.connection`: the topology (standalone, Sentinel, Cluster, embedded), the server's
  failures as typed errors, the function library, the run's schema and limits;
- `redisync.store.runs`: run administration (register, split, snapshots, delete);
- `redisync.store.protocol`: the shard protocol (claim, lease, publish, pull, owed announcements) and `ShardClient`;
- `redisync.store.subscription`: following the run's versions channel;
- `redisync.store.reads`: what an observer reads (leases, keys, streams, shards);
- `redisync.store.server`: the server itself, for a measurement (`Store.server`; the bench's).
"""

from __future__ import annotations

import os
from typing import Any

from .. import errors
from .connection import (
    CLUSTER,
    EMBEDDED,
    ENV_URL,
    ServerError,
    bounded_calls,
    masked_url,
    redis_client,
    serve_embedded,
    server_time_us,
)
from .protocol import ShardClient, ShardProtocol
from .reads import InspectionReads, LeaseReading
from .runs import Registration, RunAdmin, RunSnapshot

__all__ = [
    "EMBEDDED",
    "ENV_URL",
    "LeaseReading",
    "Registration",
    "RunSnapshot",
    "ServerError",
    "ShardClient",
    "Store",
    "connect",
    "masked_url",
    "serve_embedded",
    "server_time_us",
]


class Store(RunAdmin, ShardProtocol, InspectionReads):
    """One run on one server: register its schema, hand out shard clients, read the fleet state."""


def connect(
    url: str | None = None,
    run: str = "default",
    *,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 1000,
    call_timeout_s: float | None = None,
    retries: int | None = None,
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
        call_timeout_s: how long each call (and each connection attempt) waits for the server; unset:
            5 s (2 s to connect).
        retries: how many times a call that found no answer is sent again, without back-off; unset:
            3, with a growing back-off (a tool that must answer in time - a scrape, a command - sets
            fewer).
        redis_kwargs: passed to redis-py's client (``socket_timeout``, ``ssl_ca_certs``, ...).
    """
    url = url if url is not None else os.environ.get(ENV_URL) or None
    if url and url != EMBEDDED:
        redis_kwargs |= bounded_calls(call_timeout_s, retries)
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
