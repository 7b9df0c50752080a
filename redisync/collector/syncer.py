"""The loop glue of one collector: its terms' state goes through the store off the hot path.

``on_step()`` and ``at_reset_boundary()`` never touch the network. The `Syncer` holds a worker
(`redisync.collector.worker.Worker`) where the network runs — threads of this process
(`ThreadWorker`) or a sidecar process (`redisync.collector.sidecar.SidecarWorker`), picked by
`new_syncer` — which publishes the latest reports every ``publish_every_steps`` steps or
``publish_every_s`` seconds and prefetches the fleet state as soon as the run's channel announces a
new version. The reset boundary then only swaps the already-decoded state into the terms, so a
collector applies a new fleet state a few times a second at most, whatever the number of shards.

Life cycle: the shard's incarnation is claimed from the server at ``start()``. A term that was
loaded from a checkpoint holding its own cumulative statistics says so (``term.resumed``, set by
its ``load_state_dict``), and its keys then take over the previous life's slots instead of adding
to them; ``resume=True``/``False`` overrides that for every key.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from ..lifeline import held as lifeline_held
from ..lifeline import stop_cause
from ..store.client import Store
from .cadence import Cadence
from .seam import CountsDeviceCopies, HasMetrics, Prepares, Resumes, SyncedTerm, schema_of
from .settings import SyncSettings
from .thread_worker import ThreadWorker
from .worker import Problems, Worker, launch, report_of

_live: weakref.WeakSet[Syncer] = weakref.WeakSet()  # started and not stopped: a forked child detaches them


def _detach_in_forked_child() -> None:
    for syncer in list(_live):
        syncer._after_fork_in_child()
    _live.clear()


os.register_at_fork(after_in_child=_detach_in_forked_child)

_on_sigterm_installed = False


def _stop_on_sigterm() -> None:
    """Give SIGTERM the meaning the life cycle gives it for every collector: a scheduler's cancel or an
    operator's ``kill`` stops the process's syncers (their last reports, then their leases given up as
    ``terminated``, which observers show as ``aborted``), then does what it did before: the handler
    the program had (a trainer's own), or the default (the process dies of the signal). Installed
    once, from the main thread (the only one Python runs signal handlers in), by the first `start`;
    not where SIGTERM is ignored, nor in a process redisync started (its lifeline's handler stops it),
    and a handler the program installs later replaces it (call ``stop(cause="terminated")`` there)."""
    global _on_sigterm_installed
    if _on_sigterm_installed or threading.current_thread() is not threading.main_thread() or lifeline_held():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous in (signal.SIG_IGN, None):
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        for syncer in list(_live):
            syncer.stop(cause="terminated")
        if callable(previous):
            previous(signum, frame)
        else:  # the default: the process dies of the signal, as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    _on_sigterm_installed = True


class Syncer:
    """A collector's sync: publishes its terms' reports and prefetches the fleet state in the
    background, hands the state over at reset boundaries. Its worker runs the network in threads of
    this process unless `use` gave it another (`new_syncer` picks: this, or the sidecar process,
    the same API) — `new_syncer` is what to call."""

    def __init__(
        self,
        store: Store,
        shard_id: int,
        terms: Sequence[SyncedTerm],
        *,
        settings: SyncSettings | None = None,
        incarnation: int | None = None,
        resume: bool | frozenset[str] | None = None,
        take_over: bool = False,
    ):
        self.store = store
        self.terms = list(terms)
        self.reporting = self.terms  # the terms whose reports this process builds (a sidecar shares some)
        self.schema = schema_of(self.terms)
        self.shard = store.shard(shard_id, incarnation)
        self.resume = resume
        self.settings = SyncSettings() if settings is None else settings
        self.take_over = take_over
        self.problems = Problems(shard_id)
        self.forked = False  # this object was inherited by a forked child: it must not touch the parent's sync
        self.closing = threading.Event()  # stop() has begun: a start still waiting for the store starts no worker
        self.cadence = Cadence(self.settings.publish_every_steps, self.settings.publish_every_s)
        self._applied_version = 0
        self._applied_at = time.monotonic()
        self.starter: threading.Thread | None = None  # the start's thread: it may still be registering
        self.start_failed: str | None = None  # why the worker could not start (then nothing is published)
        self.worker: Worker = ThreadWorker(self)

    def use(self, worker: type[Any]) -> Syncer:
        """Run the network in ``worker(self)`` instead of this process's threads (before `start`)."""
        self.worker = worker(self)
        return self

    # ------------------------------------------------------------------ the collector's side (no network)

    def on_step(self) -> None:
        """Once per env step: counts, and hands over the reports when a publish is due."""
        self.worker.on_step()

    def at_reset_boundary(self) -> bool:
        """Swap the newest fleet state into the terms; True if one was applied."""
        applied = self.worker.at_reset_boundary()
        if applied is None:
            return False
        self._applied_version, self._applied_at = applied
        return True

    def flush(self) -> bool:
        """Hand over the current reports now (e.g. before a checkpoint or at the end of training);
        False when no worker can publish them (it could not start, or stopped)."""
        return self.worker.flush() and self.start_failed is None

    def wait_synced(self, at_least: int = 0, timeout: float = 10.0) -> bool:
        """Block until our reports are published and a fleet state of version >= ``at_least`` (and
        >= every version announced so far) is ready to apply. For checkpoints, shutdown and tests —
        never on the hot path."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.start_failed is None:
            if self.worker.synced(at_least):
                return True
            time.sleep(0.01)
        return False

    def take_reports(self, settle: bool = False) -> dict[str, Mapping[str, Any]]:
        """The reporting terms' reports, now (the next one falls due a whole period later)."""
        reports: dict[str, Mapping[str, Any]] = {}
        for term in self.reporting:
            reports.update(report_of(term, settle))
        self.cadence.taken()
        return reports

    @property
    def stats(self) -> dict[str, int]:
        """The worker's counters since `start` (see `metrics`)."""
        return self.worker.stats

    @property
    def latencies_ms(self) -> Sequence[float]:
        """The most recent publishes' round trips in milliseconds, newest last."""
        return self.worker.latencies_ms

    # ------------------------------------------------------------------ life cycle

    def start(self) -> Syncer:
        """Register the schema, claim the shard's incarnation and start the worker.

        Raises `SchemaMismatch` when the run is registered with another
        schema (and `PermissionDenied` when the role lacks a command the
        store needs). An unreachable or silent store is not an error here: after at most
        ``start_timeout_s`` this returns, registering and claiming go on in the background, and
        ``health()`` says why it is not ok meanwhile.
        """
        resumed = self.resume
        if resumed is None:
            resumed_keys = {k for t in self.terms if isinstance(t, Resumes) and t.resumed for k in t.schema_entries()}
            self.shard.resume = frozenset(resumed_keys)
        else:
            self.shard.resume = resumed
        # a second live process with this shard id is refused, unless asked to, or resuming its checkpoint
        self.shard.take_over = self.take_over or bool(self.shard.resume)
        for term in self.terms:  # what a term makes before the hot path (on a device: its pinned buffers)
            if isinstance(term, Prepares):
                term.prepare()
        self.worker.prepare()
        _live.add(self)
        _stop_on_sigterm()
        try:
            launch(self, self.worker)
        except BaseException:
            self.stop(flush=False, timeout=1.0)  # frees what the worker had prepared
            raise
        return self

    def _after_fork_in_child(self) -> None:
        """This object was copied into a forked child: its threads did not come along, and it must
        never stop, publish for or write into its parent's sync. A child that wants to sync starts
        a Syncer of its own."""
        self.forked = True
        self.starter = None
        self.closing.set()
        self.worker.after_fork()

    def stop(self, flush: bool = True, timeout: float = 5.0, cause: str | None = None) -> bool:
        """Stop the worker, after a last publish of the current reports when ``flush``. Returns within
        ``timeout`` even against an unresponsive server: True when every report handed over reached
        the store, False when one did not (said in the log). The lease is given up for ``cause``
        (default: `lifeline.stop_cause`, ``parent_exited`` when the trainer that started this
        process died), which observers show: a crashed trainer's collectors are not a finished run."""
        if self.forked:
            return False  # the parent's sync: not ours to stop
        _live.discard(self)
        return self.worker.stop(flush, time.monotonic() + timeout, cause or stop_cause())

    def health(self) -> dict[str, Any]:
        """Whether the worker is getting through: ``ok``, the current ``error`` (None when ok) and
        ``schema_mismatch`` (the registered schema differs from this collector's, e.g. after the store
        restarted and another trainer registered the run first)."""
        status = self.worker.status()
        return {
            "ok": status["problem"] is None,
            "error": status["problem"],
            "schema_mismatch": status["schema_mismatch"],
        }

    def has_pending(self) -> bool:
        """Whether a report handed over is still waiting to be published."""
        return self.worker.pending()

    def __enter__(self) -> Syncer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ what a trainer logs

    def metrics(self) -> dict[str, float]:
        """Flat, logger-ready metrics (every value a float), for a trainer's logger every few steps:

        - `redisync/fleet_version`: the fleet version of the state last applied at a reset boundary.
        - `redisync/staleness_versions`: versions announced or pulled since then (0: up to date).
        - `redisync/staleness_s`: seconds since a fleet state was last applied.
        - `redisync/subscribed`: 1 while the worker follows the run's versions channel (else it polls).
        - `redisync/healthy`: 1 while reports reach the store; 0 while they cannot, or for good once
          a later process claimed the shard (a zombie).
        - `redisync/schema_mismatch`: 1 when the run's registered schema differs from this one's.
        - `redisync/publish_latency_ms`, `..._p50`, `..._p99`: the last publish's round trip and the
          recent ones' percentiles, in milliseconds (after the first publish).
        - counters since `start()`: `redisync/publishes`, `duplicates` (a report the store had
          folded already), `coalesced` (reports replaced by a newer one before they were sent),
          `publish_failures`, `rejected` (refused by the store: dead-lettered), `pulls`,
          `pull_failures`, `reseeds` (the store lost the run and this shard re-seeded it),
          `subscription_drops`, `worker_errors`, `zombie_dropped`; with the sidecar also
          `sidecar_restarts`, `mailbox_overflows` and `rejected_before_sending` (a report the
          collector found invalid before it reached the sidecar).
        - per term with a `metrics()` method and a `key`: `redisync/<key>/<name>` (the sampler's
          `ema_failures_per_bin_window`, `ema_relative_noise`, `ema_uniform_share`, ...).
        - terms on a CUDA device: `redisync/device_reports_skipped` and `device_fleet_deferred`.
        """
        status = self.worker.status()
        applied = self._applied_version
        out = {
            "redisync/fleet_version": float(applied),
            "redisync/staleness_versions": float(max(status["announced"] - applied, 0)),
            "redisync/staleness_s": time.monotonic() - self._applied_at,
            "redisync/subscribed": float(status["subscribed"]),
            "redisync/healthy": float(status["problem"] is None),
            "redisync/schema_mismatch": float(status["schema_mismatch"] is not None),
        }
        out.update({f"redisync/{k}": float(v) for k, v in status["latency"].items()})
        out.update({f"redisync/{k}": float(v) for k, v in status["stats"].items()})
        for term in self.terms:
            if isinstance(term, HasMetrics) and term.key:
                out.update({f"redisync/{term.key}/{k}": float(v) for k, v in term.metrics().items()})
        # terms on a device: the reports not started and the fleet states deferred because the device
        # was behind (each is caught up at a later publish or boundary; a count that keeps growing
        # says the device cannot keep up with the publish rate)
        copies = [term.device_copies() for term in self.terms if isinstance(term, CountsDeviceCopies)]
        for name in ("device_reports_skipped", "device_fleet_deferred"):
            if copies:
                out[f"redisync/{name}"] = float(sum(c.get(name, 0) for c in copies))
        return out
