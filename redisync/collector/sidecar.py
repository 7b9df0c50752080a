"""The process worker: a sidecar process per collector owns the store connection.

``new_syncer(..., worker="process")`` (`redisync.collector.workers`) gives the collector's `Syncer` a
`SidecarWorker` (a `redisync.collector.worker.Worker`). The collector keeps its terms and its hot path; everything that sends, receives and decodes runs in a sidecar process with an
interpreter lock of its own, so it can never hold the collector's. The two meet in shared memory:

- terms that share their state (`redisync.collector.shared_state`: the sampler, the normaliser's
  report) update their buffers there in place; ``on_step()`` only counts steps, the sidecar copies
  the buffers when a publish is due, and ``at_reset_boundary()`` takes a newer staged fleet state
  with one checked copy — a counter and a copy, no lock, no syscall;
- other terms cross a `Mailbox`: ``on_step()`` checks and encodes their reports (once: the sidecar
  publishes the payloads as they came) into the outbox when a publish is due, ``at_reset_boundary()`` applies a newer fleet state the sidecar
  left decoded in the inbox.

The sidecar process (`redisync.collector.sidecar_process`) runs the thread worker's network loop
for a `Relay` of this collector's shard, so re-seeding after a store restart, the life-cycle rules,
retries and the subscription are the same code as the thread worker's. This module is the
collector's side: the mailbox, the hot path's two calls and the stop; spawning, watching and
restarting the sidecar process is `redisync.collector.sidecar_supervisor`'s.

**A sidecar holds no state of its own**; a successor (the monitor restarts one that died or hung,
and ``stop()`` starts one to publish the last report if the last one died) reads from the mailbox
header what it must continue from. The invariants:

- *incarnation*: claimed once per collector life (by the collector, or by the first sidecar when
  the store was away at ``start()``) and kept in the header; a sidecar crash is not a new life;
- *sequence numbers*: a sidecar writes a fold's seq to the header (``SEQ``) before sending it, and
  a successor continues above both that and the server's last folded seq, so it never reuses a
  seq that a dead sidecar's fold may still carry;
- *publish marks*: ``DONE`` / ``FLUSHED`` move only on the store's answer for a report (applied,
  duplicate or refused). A successor re-reads the outbox and the shared buffers and publishes the
  latest reports again — harmless, since a report replaces the shard's slot — so a sidecar killed
  at any point of a publish loses nothing, and ``wait_synced()`` / ``flush()`` mean "the store
  answered for it";
- *versions*: the newest (epoch, version) handed to the collector is written (``HANDED``) before
  the collector can see it; a successor treats an older state of that epoch as lost writes
  (re-publishes, never hands it over), as the thread worker does;
- *life*: the sidecar exits when its collector process is gone, whichever thread started it (it
  reads a pipe whose write end only the collector holds); the shared memory is anonymous
  (``memfd``), gone with the last process that maps it; a forked child detaches (private copies
  of the shared arrays, no stop, no writes into the parent's mailbox).
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import errors
from ..lifeline import STOP_CAUSES
from ..store.client import ShardClient, Store
from ..store.codec import KeyView, PullResult
from ..store.schema import Limits, Schema, encode_reports
from .mailbox import (
    DONE,
    FLUSH,
    FLUSHED,
    HANDED,
    INBOX,
    INCARNATION,
    OUTBOX,
    SEQ,
    STATUS,
    STEPS,
    STOP,
    STOP_CAUSE,
    Mailbox,
    MailboxFull,
    unpack_handed,
)
from .report_codec import ReportCodec
from .seam import SharesFleet, SharesReport, SyncedTerm
from .shared_state import SharedState
from .sidecar_supervisor import Supervisor
from .thread_worker import STATS
from .worker import Host, claim, join_start, report_of

log = logging.getLogger(__name__)


def _slot_bytes(schema: Schema, copies: int) -> int:
    """Room for ``copies`` float64 vectors per key, pickling overhead, and a factor of two to spare."""
    floats = sum(spec.width for spec in schema.keys.values())
    return 2 * (copies * 8 * floats + 512 * len(schema.keys)) + 4096


class SidecarWorker:
    """The collector's side of the process worker: a `Worker` over a mailbox and shared memory.

    What crosses threads (the collector's and its signal handlers, the start's, the monitor): the
    hand-over (``_out_seq``, ``_owed``, ``_writing``: the collector and a handler that interrupted it;
    ``_writing`` keeps a second writer off a half-written message); ``_limits`` / ``_limits_read``
    written by the start's thread or the monitor, read by the hand-over; the sidecar's process, the
    `Supervisor`'s (replaced by its monitor, or by ``stop()`` once the monitor has ended); its status
    and the counters of replaced sidecars (``_status``, ``_retired``, ``_status_seq``) under
    ``_status_lock``; ``_own_stats`` counted by either. Across the process boundary only the mailbox's
    header and slots (`redisync.collector.mailbox`) and the shared buffers."""

    def __init__(self, syncer: Host):
        self.syncer = syncer
        self.store, self.shard, self.schema, self.problems = syncer.store, syncer.shard, syncer.schema, syncer.problems
        store = self.store
        if store.connect_args is None:
            raise errors.ConfigurationError(
                "worker='process' needs a Redis URL: the embedded store lives inside this process, where a sidecar "
                "cannot reach it (pass a URL to connect(), set REDISYNC_URL, or use worker='thread')"
            )
        for option, value in store.connect_args[1].items():  # the sidecar gets them pickled
            try:
                pickle.dumps(value)
            except Exception as e:
                raise errors.ConfigurationError(
                    f"worker='process': the store's option {option}={value!r} cannot reach the sidecar process "
                    f"(it cannot be pickled: {e}); give the sidecar what it needs in the URL or the environment, "
                    "or use worker='thread'"
                ) from None
        self._own_stats = {"sidecar_restarts": 0, "mailbox_overflows": 0, "rejected_before_sending": 0}
        self._limits = Limits()  # the run's, once the start has registered it (the checks of a report use them)
        self._limits_read = False
        self._writing = False  # a hand-over is writing the outbox (a signal handler may interrupt it)
        self._stopped_published = False  # what stop() returned (a second call returns it again)
        self._codec = ReportCodec(self.schema)
        self.mailbox: Mailbox | None = None
        self.sidecar: Supervisor | None = None  # the sidecar's process, once the mailbox exists
        self._out_seq = 0
        self._in_seq = 0
        self._status: dict[str, Any] = {}
        self._retired: dict[str, int] = {}  # the counters of the sidecars replaced so far, as they last reported
        self._status_lock = threading.RLock()  # the status read vs a replacement's carry-over (re-entrant: signals)
        self._status_seq = 0
        self._header: Any = None  # the mailbox's header once started: on_step counts steps there
        self._shared: SharedState | None = None  # the shared terms' buffers (see redisync.collector.shared_state)
        self._handed: list[SyncedTerm] = syncer.terms  # the terms handed decoded fleet states
        self._sidecar_stats: dict[str, int] = dict.fromkeys(STATS, 0)  # the sidecar's counters as last reported
        self._ready: PullResult | None = None  # the newest fleet state the sidecar left in the inbox, decoded
        self._ready_at = 0.0
        self._applied: PullResult | None = None
        self._flush_request = 0
        self._owed = False  # a report fell due while the sidecar was busy and was not handed over yet

    # ------------------------------------------------------------------ the collector's side (no network)

    @property
    def stats(self) -> dict[str, int]:
        """The worker's counters, summed over every sidecar this collector has run (a replaced one's
        as it last reported them), and the collector's own."""
        stats: dict[str, int] = self.status()["stats"]
        return stats

    @property
    def latencies_ms(self) -> list[float]:
        """The sidecar's most recent publish latencies."""
        return list(self.status().get("latencies_ms", ()))

    def on_step(self) -> None:
        """Once per env step: counts. The shared terms' reports are the sidecar's to read when a
        publish is due; the other terms' are handed over when a publish is due *and the sidecar is
        free* (it has published the last report): a report it could not send yet would only be
        replaced by the next, so building it is work the hot path can skip."""
        header = self._header
        if header is not None:
            header[STEPS] += 1
        if self.syncer.reporting and self.syncer.cadence.step():
            if header is not None and header[DONE] >= self._out_seq:
                self._take_reports()
            else:
                self._owed = True  # due while the sidecar was busy: handed over when it is free

    def flush(self) -> bool:
        """Hand over the copied terms' reports and ask the sidecar to publish the shared ones now;
        False when no sidecar can publish them (it could not start, or the syncer stopped)."""
        self._take_reports(settle=True)
        if self._header is not None and self._shared is not None and self._shared.parts:
            self._header[FLUSH] += 1
            self._flush_request = self._header[FLUSH]
        return self.mailbox is not None and self.sidecar is not None and self.sidecar.process is not None

    def _take_reports(self, settle: bool = False) -> None:
        reports = self.syncer.take_reports(settle)
        if reports:
            self._hand_over(reports)

    def pending(self) -> bool:
        """Whether the sidecar has not answered yet for a report handed over (or a flush asked)."""
        box = self.mailbox
        return box is not None and (box.header[DONE] < self._out_seq or box.header[FLUSHED] < self._flush_request)

    def _hand_over(self, reports: dict[str, Mapping[str, Any]]) -> None:
        if self.mailbox is None:  # stopped, or a forked child's copy of its parent's syncer
            return
        if self._writing:  # a signal handler's flush() interrupted a hand-over in this thread: that one
            self._owed = True  # finishes its message (a second writer would tear it); this report is owed
            return
        self._owed = False
        self._writing = True
        try:
            self._write_reports(reports)
        finally:
            self._writing = False

    def _write_reports(self, reports: dict[str, Mapping[str, Any]]) -> None:
        assert self.mailbox is not None
        try:
            try:
                # the thread worker's checks, so a report has the same outcome with either worker; the
                # payloads travel as they are encoded here
                payloads = encode_reports(self.schema, reports, self._limits, self.shard.shard_id)
                assert self.mailbox is not None
                self._out_seq = self.mailbox.write_vectors(OUTBOX, self._codec.encode(payloads))
            except (MailboxFull, errors.InvalidReport):
                raise
            except (TypeError, ValueError, RuntimeError) as e:  # a part numpy cannot read, as the models name it
                raise errors.MalformedReport(None, f"not an array of numbers: {e}") from None
            if self.problems.current is not None:
                self.problems.clear("publish")
        except (MailboxFull, errors.InvalidReport) as e:  # refused here, as the thread worker would: training goes on
            self._own_stats["mailbox_overflows" if isinstance(e, MailboxFull) else "rejected_before_sending"] += 1
            self.problems.report(f"publish: {e}", logging.ERROR)

    def at_reset_boundary(self) -> tuple[int, float] | None:
        """Take a newer fleet state in: the shared terms' with one copy, the others' decoded from
        the inbox. Its version and when it was ready, or None."""
        shared = self._shared
        applied = None
        if shared is not None and shared.staged[0] != shared.taken and shared.take():
            applied = shared.applied, time.monotonic()
        if self._handed:
            header = self._header
            if header is not None and header[2 * INBOX] != self._in_seq:
                self._fetch()
            ready = self._ready
            if ready is not None and ready is not self._applied:
                for term in self._handed:
                    term.apply_shard_state(ready)
                self._applied = ready
                applied = ready.fleet_version, self._ready_at
        return applied

    def _decode(self, message: tuple[Any, ...]) -> PullResult:
        epoch, version, epoch_changed, server_time_us, lost_writes, keys = message
        views = {}
        for name, key_version, value, own, own_incarnation in keys:  # float64 bytes: no array unpickling
            views[name] = KeyView(
                name,
                self.schema.keys[name],
                key_version,
                None if value is None else np.frombuffer(value).copy(),
                None if own is None else np.frombuffer(own).copy(),
                own_incarnation,
            )
        return PullResult(epoch, version, epoch_changed, views, server_time_us, lost_writes)

    def _fetch(self) -> None:
        """Take the newest fleet state the sidecar left in the inbox (decoded, not applied)."""
        got = self.mailbox.read(INBOX, self._in_seq) if self.mailbox is not None else None
        if got is not None:
            self._in_seq, message = got
            self._ready, self._ready_at = self._decode(message), time.monotonic()

    def synced(self, at_least: int) -> bool:
        """As the thread worker's; a shared term's report is read by the sidecar itself."""
        self._fetch()
        ready, box = self._ready, self.mailbox
        if self._owed and box is not None and box.header[DONE] >= self._out_seq:
            self._take_reports()  # the report on_step skipped, as the thread worker would have it pending
        published = box is not None and box.header[DONE] >= self._out_seq and box.header[FLUSHED] >= self._flush_request
        return published and ready is not None and ready.fleet_version >= max(at_least, self.status()["announced"])

    def status(self) -> dict[str, Any]:
        """The sidecar's last status (its worker's counters, problem, subscription, latencies) with
        the collector's own counters and problem on top."""
        with self._status_lock:
            if self.mailbox is not None:
                got = self.mailbox.read(STATUS, self._status_seq)
                if got is not None:
                    self._status_seq, self._status = got
            status = {
                "announced": 0,
                "subscribed": False,
                "problem": None,
                "schema_mismatch": None,
                "latency": {},
                "stats": self._sidecar_stats,
            } | self._status
            counts = {k: int(v) + self._retired.get(k, 0) for k, v in status["stats"].items()}
        zombie = (status["problem"] or "").startswith("zombie:")  # for good: it outranks a passing problem of ours
        problem = status["problem"] if zombie else self.problems.current or status["problem"]
        return status | {"problem": problem, "stats": {**self._retired, **counts, **self._own_stats}}

    def _retire_sidecar(self) -> None:
        """Before a replacement starts: keep the dead sidecar's counters (its last status), so that the
        collector's counters go on from them instead of falling back to the new sidecar's zeros."""
        with self._status_lock:
            self.status()  # its last status, if not read yet
            stats = self._status.get("stats", {})
            for k, v in stats.items():
                self._retired[k] = self._retired.get(k, 0) + int(v)
            self._status = {**self._status, "stats": dict.fromkeys(stats, 0)}  # counted: the next sidecar starts at 0

    # ------------------------------------------------------------------ life cycle

    def prepare(self) -> None:
        """The mailbox and the shared buffers exist before start() returns, so the hot path works at
        once, even while the store has not answered yet."""
        self.mailbox = Mailbox.create(_slot_bytes(self.schema, 1), _slot_bytes(self.schema, 2))
        self._share_state()
        self._header = self.mailbox.header
        self.sidecar = Supervisor(
            self.mailbox,
            self._sidecar_config,
            self.problems,
            str(self.shard.shard_id),
            on_restart=self._restarting,
            on_check=self._check_limits,
        )

    def rehome(self, store: Store, shard: ShardClient) -> None:
        """Publish as ``shard`` of ``store`` from now on (the run is split: the shard's sub-run)."""
        self.store, self.shard = store, shard

    def register(self) -> None:
        """Register the schema and claim the shard in this process, and lease it (the sidecar renews it)."""
        claim(self.syncer, None)
        self.store.lease(self.shard.shard_id, self.shard.incarnation, max(1, int(self.syncer.settings.lease_s * 1e3)))

    def start(self) -> None:
        """Spawn the sidecar, wait for it to serve, and watch it."""
        assert self.mailbox is not None
        assert self.sidecar is not None
        self._limits_read = self._read_limits()
        if self.shard.claimed_incarnation is not None:
            self.mailbox.header[INCARNATION] = self.shard.claimed_incarnation + 1
        self.sidecar.spawn()
        # start() returns with the sidecar serving (it takes about a second to start a Python process):
        # a collector that trains and stops at once still has its reports published
        self.sidecar.await_serving()
        self.sidecar.watch()

    def _read_limits(self) -> bool:
        """The run's size limits, for the collector's own checks of a report (the start's thread or
        the monitor, never the hot path). The store may be restarting or have lost the run just after
        the registration: that is no reason for the start to fail for good, so until they are read
        the defaults stand (the sidecar checks against the run's own before sending) and the
        monitor reads them again."""
        try:
            self._limits = self.store.limits()
        except errors.RedisyncError as e:
            log.info("redisync shard %d: the run's limits are not readable yet (%s)", self.shard.shard_id, e)
            return False
        return True

    def _share_state(self) -> None:
        """Offer every term shared memory for what it reports and receives; the ones that take it
        leave the copy path in that direction."""
        shared = SharedState(self.schema)
        terms = self.syncer.terms
        self.syncer.reporting = [t for t in terms if not (isinstance(t, SharesReport) and t.share_report(shared))]
        self._handed = [t for t in terms if not (isinstance(t, SharesFleet) and t.share_fleet(shared))]
        if shared.parts or shared.received:
            self._shared = shared
        else:
            shared.release()

    def _sidecar_config(self, lifeline: int) -> dict[str, Any]:
        """What a new sidecar is told: the store, the shard, where its collector's life stands (the
        mailbox header's incarnation), the mailbox, the shared buffers, the settings; ``lifeline``:
        its pipe's read end."""
        assert self.mailbox is not None
        claimed = self.mailbox.header[INCARNATION]
        return {
            "connect": self.store.connect_args,
            "run": self.store.run,
            "shard_id": self.shard.shard_id,
            "incarnation": claimed - 1 if claimed else None,
            "resume": self.shard.resume,
            "take_over": self.shard.take_over,
            "schema": self.schema.canonical_json(),
            "mailbox": (self.mailbox.name, self.mailbox.sizes),
            "lifeline": lifeline,
            "shared": None if self._shared is None else self._shared.layout(),
            "settings": self.syncer.settings.as_dict(),
        }

    def _check_limits(self) -> None:
        """The monitor's check: the run's limits, until they are read."""
        if not self._limits_read:
            self._limits_read = self._read_limits()

    def _restarting(self) -> None:
        """A sidecar is about to be replaced: counted, its counters kept."""
        self._own_stats["sidecar_restarts"] += 1
        self._retire_sidecar()

    def stop(self, flush: bool, deadline: float, cause: str) -> bool:
        """Ask the sidecar to publish the current reports (when ``flush``) and exit; kill it if it has
        not by ``deadline``. A sidecar that died just before is replaced first, so the last
        report is published whenever the last sidecar died; one that cannot publish in time (starved
        on a loaded machine: it runs at a lower priority) is killed and the collector publishes the
        last report itself. Frees the shared memory. True when the last reports reached the store."""
        if self.mailbox is None:
            return self._stopped_published
        self.mailbox.header[STOP_CAUSE] = STOP_CAUSES.index(cause)  # before STOP: the sidecar gives the lease up for it
        timeout = max(0.0, deadline - time.monotonic())
        self.syncer.closing.set()  # a start still waiting for the store does not spawn a sidecar any more
        join_start(self.syncer, deadline)
        if flush:
            self.flush()
        sidecar = self.sidecar
        assert sidecar is not None
        sidecar.end_watch(deadline)
        published = False
        if sidecar.process is None:
            if flush:
                log.warning(
                    "redisync shard %d: stopped before the store answered at start: the last report was not published",
                    self.shard.shard_id,
                )
        elif flush:
            # the sidecar first; the collector keeps a share of the time to publish it itself
            published = self._last_publish(deadline - min(1.5, timeout / 3))
            if not published and not self._writing:
                published = self._publish_directly(deadline)
        else:
            self.mailbox.header[STOP] = 2
            sidecar.wait_exit(sidecar.process, deadline)
        self._stopped_published = published
        self.status()  # the last counters, for metrics() after stop()
        sidecar.cut_lifeline()
        if self._writing:  # stop() from a signal handler that interrupted a hand-over: it resumes into these
            log.warning(
                "redisync shard %d: stopped from a signal handler during a hand-over: the report being handed over "
                "was not published (the one before it was)",
                self.shard.shard_id,
            )
            return False  # (the shared memory is freed at exit: the interrupted write must find it mapped)
        self._header = None
        sidecar.mailbox = None
        self.mailbox.close()
        self.mailbox = None
        if self._shared is not None:
            self._shared.release()
        return published

    def _publish_directly(self, deadline: float) -> bool:
        """The last reports, published by the collector itself (the sidecar could not in time): above
        every sequence number a sidecar reserved, so a late fold of a killed sidecar is refused. Waits
        for the store until ``deadline`` only (a store that hangs gets the publish in the background)."""
        assert self.mailbox is not None
        reports: dict[str, Mapping[str, Any]] = {}
        for term in self.syncer.terms:
            reports.update(report_of(term, settle=True))
        if not reports:
            return True
        self.shard.seq = max(self.shard.seq, int(self.mailbox.header[SEQ]))
        handed = unpack_handed(self.mailbox.header[HANDED])
        if handed is not None:  # the report says what the shard had seen: the newest state handed to it
            self.shard.continue_from(*handed)
        outcome: list[BaseException | None] = []
        cause = STOP_CAUSES[int(self.mailbox.header[STOP_CAUSE])]

        def publish() -> None:
            try:
                self.shard.publish(reports)
                outcome.append(None)
            except Exception as e:
                outcome.append(e)
                return
            # the collector stops: its lease given up, as its sidecar's stop would have (a state key
            # leaves the shard at the next fold instead of waiting out a lease and its grace)
            with contextlib.suppress(Exception):
                self.store.lease(self.shard.shard_id, self.shard.incarnation, 0, cause)

        sender = threading.Thread(target=publish, name=f"redisync-last-report-{self.shard.shard_id}", daemon=True)
        sender.start()
        sender.join(max(0.0, deadline - time.monotonic()))
        if not outcome or outcome[0] is not None:  # said, and returned: the caller decides
            log.warning(
                "redisync shard %d: the sidecar did not publish the last report within the stop timeout, and the "
                "collector could not either: %s",
                self.shard.shard_id,
                outcome[0] if outcome else "the store did not answer in time",
            )
            return False
        log.info(  # nothing was lost: not a fault
            "redisync shard %d: the sidecar did not publish the last report within its share of the stop timeout "
            "(a loaded machine?): the collector published it itself",
            self.shard.shard_id,
        )
        return True

    def _last_publish(self, deadline: float) -> bool:
        """Have a sidecar publish the last reports and exit cleanly (True once the store answered for
        them). One that is dead, or dies before it exits cleanly (a SIGKILLed process can look alive
        for a moment while its threads are torn down), is replaced, until the deadline."""
        box, sidecar = self.mailbox, self.sidecar
        assert box is not None
        assert sidecar is not None
        box.header[STOP] = 1  # a successor that sees it publishes what it reads, then exits
        while True:
            process = sidecar.process
            assert process is not None
            if process.poll() is None and sidecar.wait_exit(process, deadline) == 0:
                return box.header[DONE] >= self._out_seq and box.header[FLUSHED] >= self._flush_request
            if time.monotonic() >= deadline:
                return False
            sidecar.respawn(deadline)

    def after_fork(self) -> None:
        """The child keeps no sidecar, no lifeline and private copies of the shared buffers."""
        self._header, self.mailbox = None, None
        if self.sidecar is not None:
            self.sidecar.after_fork()
        if self._shared is not None:
            self._shared.detach_forked()
            self._shared = None

    @property
    def sidecar_pid(self) -> int | None:
        """The sidecar process's pid (None before it starts)."""
        return self.sidecar.pid if self.sidecar is not None else None
