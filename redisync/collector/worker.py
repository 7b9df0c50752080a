"""What a `Syncer` asks of its worker, and what both workers share.

A worker is where the network runs: `ThreadWorker` (threads of the collector's process) or
`SidecarWorker` (a process of its own beside the collector). The `Syncer` holds one and talks to it
through `Worker` only: the hot path's two calls, the start, the stop and what it reports.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from .. import errors
from ..store.client import ShardClient, Store
from ..store.schema import Limits, Schema
from .seam import Settles, SyncedTerm
from .settings import SyncSettings

log = logging.getLogger("redisync.collector.syncer")  # (one logger for the collector's sync, either worker)


class Host(Protocol):
    """What a worker sees of the `Syncer` that holds it: the run, the shard, the terms, the settings
    and the collector-side cadence (so that the module of each worker depends on this one only)."""

    store: Store
    shard: ShardClient
    schema: Schema
    terms: list[SyncedTerm]
    reporting: list[SyncedTerm]  # the terms whose reports this process builds (a sidecar shares some)
    problems: Problems
    settings: SyncSettings
    forked: bool  # a forked child's copy: never touches the parent's sync
    closing: threading.Event  # stop() has begun: a start still waiting starts no worker

    def report_due(self) -> bool:
        """Counts a step of the reporting terms: whether a report is due."""

    def take_reports(self, settle: bool = False) -> dict[str, Mapping[str, Any]]:
        """The reporting terms' reports, now."""

    def join_start(self, deadline: float) -> None:
        """Wait, until ``deadline`` at most, for a start still registering in the background."""


class Worker(Protocol):
    """The network side of a collector's sync. The two hot-path calls never block on the network,
    a lock another process holds or a system call."""

    @property
    def stats(self) -> dict[str, int]:
        """The counters since ``start()`` (see `Syncer.metrics`)."""

    @property
    def latencies_ms(self) -> Sequence[float]:
        """The most recent publishes' round trips, newest last."""

    def prepare(self) -> None:
        """What the hot path needs before the store has answered (no network)."""

    def rehome(self, store: Store, shard: ShardClient) -> None:
        """Publish as ``shard`` of ``store`` instead (before `register`: the shard's run is split)."""

    def register(self) -> None:
        """Register the schema and claim the shard (the start's thread; raises what start() raises)."""

    def start(self) -> None:
        """Start publishing and following the fleet (the shard is claimed)."""

    def on_step(self) -> None:
        """Once per env step (the hot path): hand the reports over when a publish is due."""

    def at_reset_boundary(self) -> tuple[int, float] | None:
        """Apply a newer fleet state to the terms (the hot path): its version and when it was ready,
        or None when there is none."""

    def flush(self) -> bool:
        """Hand the current reports over now; False when nothing can publish them."""

    def synced(self, at_least: int) -> bool:
        """Whether every report handed over is published and a fleet state of version ``at_least``
        (and every version announced) is ready; asks for what is missing."""

    def pending(self) -> bool:
        """Whether a report handed over waits for the store's answer."""

    def stop(self, flush: bool, deadline: float, cause: str) -> bool:
        """Stop by ``deadline`` (after a last publish when ``flush``), the lease given up for ``cause``
        (one of `lifeline.STOP_CAUSES`); whether the last reports reached the store."""

    def status(self) -> dict[str, Any]:
        """``announced``, ``subscribed``, ``problem``, ``schema_mismatch``, ``latency``, ``stats``."""

    def after_fork(self) -> None:
        """This process is a forked child's copy: never touch the parent's sync again."""


class Problems:
    """The sync's current problem, logged once per change: a problem repeated by every retry is one line."""

    def __init__(self, shard_id: int):
        self.shard_id = shard_id
        self.current: str | None = None

    def report(self, text: str, level: int, exc: bool = False) -> None:
        """``text`` is the problem now (logged at ``level`` if it is a new one)."""
        if text != self.current:
            log.log(level, "redisync shard %d: %s (retrying)", self.shard_id, text, exc_info=exc)
        self.current = text

    def clear(self, what: str) -> None:
        """The step ``what`` works again: its problem, if it is the current one, is gone."""
        if self.current is not None and self.current.startswith(what + ":"):
            log.info("redisync shard %d: %s works again", self.shard_id, what)
            self.current = None


def report_of(term: SyncedTerm, settle: bool = False) -> Mapping[str, Mapping[str, Any]]:
    """A term's report; with ``settle`` (a flush, a stop: never the hot path) its current one, from
    a term whose state lives on a device and whose hot-path reports lag by a publish (``settle()``)."""
    return term.settle() if settle and isinstance(term, Settles) else term.report_shard_state()


def claim(syncer: Host, limits: Limits | None) -> Limits | None:
    """Register the schema and claim the shard's incarnation (a no-op once claimed); the run's limits
    as first read. A shard whose holder's lease is fresh is refused (`ShardInUse`) as soon as the
    holder renews it; a crashed holder's lease is waited out (at most one lease)."""
    store, shard, lease_s = syncer.store, syncer.shard, syncer.settings.lease_s
    # the run's limits as first read: a store that lost the run gets them back, not the defaults
    store.register(syncer.schema, limits)
    if limits is None:
        with contextlib.suppress(errors.RedisyncError):  # (unreadable: the next registration reads them)
            limits = store.limits()
    deadline, held_until = time.monotonic() + lease_s + 1.0, None
    while True:
        try:
            _ = shard.incarnation  # (claimed by the property, refused while a live holder renews)
            return limits
        except errors.ShardInUse as e:
            until = time.monotonic() + e.remaining_ms / 1e3
            if (held_until is not None and until > held_until + 0.5) or until > deadline:
                raise  # renewed meanwhile: a live process holds it
            held_until = until if held_until is None else max(held_until, until)
            time.sleep(min(e.remaining_ms / 1e3 + 0.05, lease_s / 15))  # three looks per renewal
