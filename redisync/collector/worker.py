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
from .cadence import Cadence
from .seam import Settles, SyncedTerm
from .settings import SyncSettings

log = logging.getLogger("redisync.collector.syncer")  # (one logger for the collector's sync, either worker)


class Host(Protocol):
    """What a worker sees of what holds it — a collector's `Syncer`, or the sidecar process's
    `redisync.collector.sidecar_process.Relay`: the run, the shard, the terms, the settings and the
    cadence (so that the module of each worker depends on this one only)."""

    store: Store
    shard: ShardClient
    schema: Schema
    terms: list[SyncedTerm]  # the terms handed fleet states
    reporting: list[SyncedTerm]  # the terms whose reports this process builds (a sidecar shares some)
    problems: Problems
    settings: SyncSettings
    cadence: Cadence  # when a report falls due (counted on the hot path)
    forked: bool  # a forked child's copy: never touches the parent's sync
    closing: threading.Event  # stop() has begun: a start still waiting starts no worker
    starter: threading.Thread | None  # the start's thread (`launch`): it may still be registering
    start_failed: str | None  # why the worker could not start (then nothing is published)

    def take_reports(self, settle: bool = False) -> dict[str, Mapping[str, Any]]:
        """The reporting terms' reports, now (the next one falls due a whole period later)."""


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


def join_start(host: Host, deadline: float) -> None:
    """Wait, until ``deadline`` at most, for a start still registering in the background."""
    starter = host.starter
    if starter is not None and starter.is_alive():
        starter.join(max(0.0, deadline - time.monotonic()))


def launch(host: Host, worker: Worker) -> None:
    """Register the schema, claim the shard and start ``worker``, from a thread of its own
    (``host.starter``). Returns once the worker started, or after ``start_timeout_s`` with
    registering and claiming going on in the background (said by the host's problems); raises what
    registering raised meanwhile (`SchemaMismatch`, `PermissionDenied`, ...)."""
    registered, returned = threading.Event(), threading.Event()
    failure: list[BaseException] = []

    def register_then_start() -> None:
        try:
            while not _found_home(host, worker):  # nothing is published before the shard knows its run
                if host.closing.wait(host.settings.retry_every_s):
                    return
            worker.register()  # the incarnation is claimed now, before this process publishes anything
            host.problems.clear("start")
        except errors.ConnectionUnavailable as e:
            log.info("store unavailable at start (the worker keeps trying): %s", e)
        except BaseException as e:  # raised by the start while it waits; shown by health() once it has returned
            failure.append(e)
            registered.set()
            if returned.is_set():
                host.problems.report(f"start: {type(e).__name__}: {e}", logging.ERROR)
            return
        registered.set()
        if not host.closing.is_set():
            try:
                worker.start()
            except BaseException as e:  # nothing would reach the store: said at once, never silent
                host.start_failed = f"start: the worker could not start: {type(e).__name__}: {e}"
                host.problems.report(host.start_failed, logging.ERROR, exc=True)

    starter = threading.Thread(target=register_then_start, name=f"redisync-start-{host.shard.shard_id}", daemon=True)
    host.starter = starter
    starter.start()
    if not registered.wait(host.settings.start_timeout_s):
        returned.set()
        host.problems.report(
            f"start: the store did not answer within {host.settings.start_timeout_s:g} s "
            "(registering and claiming the shard go on in the background)",
            logging.WARNING,
        )
        return
    if failure:
        raise failure[0]
    starter.join()  # the worker's own start (a sidecar's is bounded by its start-up time)


def _found_home(host: Host, worker: Worker) -> bool:
    """Move the shard to its sub-run if the run is split (`Store.split`); False while the store
    cannot say (the start's thread tries again)."""
    try:
        home = host.store.home(host.shard.shard_id)
    except errors.ConnectionUnavailable as e:
        log.info("store unavailable at start (the start keeps trying): %s", e)
        return False
    if home is not host.store:
        old = host.shard
        shard = home.shard(old.shard_id, old.claimed_incarnation, resume=old.resume, reserve=old.reserve)
        shard.take_over = old.take_over
        host.store, host.shard = home, shard
        worker.rehome(home, shard)
    return True
