"""Which worker a collector's :class:`~redisync.collector.syncer.Syncer` gets: the one decision both
worker modules sit below (the sidecar's is a subclass of the thread worker's Syncer)."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from typing import Any

from .. import errors
from ..store.client import Store
from .seam import SyncedTerm
from .sidecar import SidecarSyncer
from .syncer import Syncer

WORKERS = ("auto", "process", "thread")


def stores_in_order() -> bool:
    """Whether this CPU makes one core's stores visible to the others in program order (x86's TSO)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def new_syncer(
    store: Store, shard_id: int, terms: Sequence[SyncedTerm], *, worker: str = "auto", **kwargs: Any
) -> Syncer:
    """A collector's Syncer. ``worker="process"`` runs the network in a sidecar process of its own,
    which keeps the collector's interpreter lock free for its hot path; ``worker="thread"`` in a
    thread of the collector's process. ``"auto"`` (the default) takes the sidecar for a Redis URL and
    the thread for the embedded store, which lives inside the process. Same API, same rules.

    The sidecar's seqlocks are plain stores from Python, with no memory fences: they rely on a CPU
    that keeps stores in order (x86's TSO). Elsewhere ``"auto"`` takes the thread, and asking for the
    process is refused. ``kwargs`` go to :class:`~redisync.collector.syncer.Syncer`."""
    if worker not in WORKERS:
        raise errors.ConfigurationError(f"worker must be one of {WORKERS}, got {worker!r}")
    if worker == "auto":
        worker = "process" if getattr(store, "connect_args", None) is not None and stores_in_order() else "thread"
    if worker == "process" and not stores_in_order():
        raise errors.ConfigurationError(
            f"worker='process' needs a CPU that keeps stores in order (x86); this one is {platform.machine()!r}: "
            "use worker='thread'"
        )
    return (SidecarSyncer if worker == "process" else Syncer)(store, shard_id, terms, **kwargs)
