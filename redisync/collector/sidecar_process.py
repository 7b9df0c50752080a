"""The sidecar process: the network loop of one collector, beside it.

`redisync.collector.sidecar.SidecarWorker` (the collector's side) spawns this process and meets it
in a `Mailbox` and shared memory. Here the thread worker's network loop (`ThreadWorker`) serves a
`Relay` — the collector's shard and settings, one `MailboxTerm` for its terms — so re-seeding after
a store restart, the life-cycle rules, retries and the subscription are the same code in either
worker. `serve` moves what the collector wrote (the outbox, the shared buffers when the
`SharedCadence` says a report is due) to the worker, and what the worker pulled to the inbox; it
holds no state a successor could not read back from the mailbox header (see
`redisync.collector.sidecar`).
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..lifeline import STOP_CAUSES
from ..store.client import Store, connect
from ..store.codec import PullResult
from ..store.schema import Schema
from .cadence import Cadence
from .mailbox import (
    DONE,
    FLUSH,
    FLUSHED,
    HANDED,
    HEARTBEAT_MS,
    INBOX,
    INCARNATION,
    OUTBOX,
    SEQ,
    SIDECAR_PID,
    STATUS,
    STEPS,
    STOP,
    STOP_CAUSE,
    Mailbox,
    pack_handed,
    unpack_handed,
)
from .report_codec import ReportCodec
from .seam import SyncedTerm
from .settings import SyncSettings
from .shared_state import SidecarState
from .thread_worker import ThreadWorker
from .worker import Problems, launch

log = logging.getLogger("redisync.collector.sidecar")  # (the sidecar's lines keep their logger's name)

LOOP_S = 0.001  # how often the sidecar looks at the outbox and its worker
STATUS_EVERY_S = 0.05
STATUS_LATENCIES = 1000  # the most recent publish latencies the status carries
NICE = 10  # where SCHED_BATCH is missing (not Linux): background work yields the CPU to its collector


class MailboxTerm:
    """The collector's terms as the sidecar's network loop sees them: reports from the outbox (copied
    terms) and from the shared buffers (shared terms), the fleet state written to the inbox."""

    def __init__(self, schema: Schema, mailbox: Mailbox, shared: SidecarState | None):
        self.schema, self.mailbox, self.shared_state = schema, mailbox, shared
        self.codec = ReportCodec(schema)
        self.copied: dict[str, Any] = {}  # the copied terms' payloads, encoded by the collector
        self.shared: dict[str, Mapping[str, Any]] = {}

    def schema_entries(self) -> Mapping[str, Any]:
        """The keys of the terms whose reports travel through the mailbox."""
        return self.schema.keys

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """The reports the collector handed over, decoded from the mailbox."""
        return {**self.copied, **self.shared}

    def apply_shard_state(self, fleet: PullResult) -> None:
        # first: a successor must know of this state before the collector can have applied it
        """Stage the fleet state in the mailbox for the collector's next reset boundary."""
        self.mailbox.header[HANDED] = pack_handed(fleet.epoch, fleet.fleet_version)
        if self.shared_state is not None:  # staged first: once the inbox shows a version, the staging holds it
            self.shared_state.stage(fleet)
        keys = [
            (
                name,
                v.version,
                None if v.value is None else v.value.tobytes(),
                None if v.own_slot is None else v.own_slot.tobytes(),
                v.own_incarnation,
            )
            for name, v in fleet.keys.items()
        ]
        self.mailbox.write(
            INBOX,
            (fleet.epoch, fleet.fleet_version, fleet.epoch_changed, fleet.server_time_us, fleet.lost_writes, keys),
        )


class SharedCadence:
    """When the sidecar reads the shared terms' buffers: when the collector's steps (counted in the
    header) make a report due by the collector's `Cadence`, if it stepped at all and the worker is
    free — and at once for a flush request. A copy whose sequence number was published already is
    not published again."""

    def __init__(self, reader: SidecarState, header: Any, cadence: Cadence):
        self.reader, self.header, self.cadence = reader, header, cadence
        self.published_seq = -1
        self.covered = 0  # the last flush request a copy was taken after

    def due(self, now: float, busy: bool) -> bool:
        """Whether a report is due: enough steps or seconds since the last one."""
        if self.header[FLUSH] > self.covered:
            return True
        steps = self.header[STEPS]
        return not busy and steps > self.cadence.steps_at and self.cadence.due(steps, now)

    def take(self, now: float) -> dict[str, Any] | None:
        """The shared reports if they changed since the last ones taken; None otherwise, or when the
        collector was writing them each time we looked."""
        request, steps = self.header[FLUSH], self.header[STEPS]
        snapshot = self.reader.snapshot()
        if snapshot is None:
            return None
        seq, reports = snapshot
        self.cadence.taken(steps, now)
        self.covered = request
        if seq == self.published_seq:
            return None
        self.published_seq = seq
        return reports


class Relay:
    """What the network loop (`ThreadWorker`) serves in the sidecar process, in place of a
    collector's `Syncer`: one `MailboxTerm` for the collector's terms, the collector's settings and
    shard, sequence numbers reserved in the mailbox header before each fold. No hot path: the
    loop in `serve` hands it what the collector wrote and takes what the worker pulled."""

    def __init__(self, store: Store, config: dict[str, Any], term: MailboxTerm, header: Any):
        settings = SyncSettings(**config["settings"])
        shard_id = config["shard_id"]
        self.store, self.schema, self.settings = store, term.schema, settings
        self.shard = store.shard(
            shard_id,
            config["incarnation"],
            resume=config["resume"],
            reserve=lambda seq: header.__setitem__(SEQ, seq),  # before the fold is sent
        )
        # a second live process with this shard id is refused, unless asked to, or resuming its checkpoint
        self.shard.take_over = config["take_over"] or bool(self.shard.resume)
        self.terms: list[SyncedTerm] = [term]
        self.reporting: list[SyncedTerm] = [term]
        self.problems = Problems(shard_id)
        # the collector counts its steps in the header; the shared buffers are read by its cadence
        self.cadence = Cadence(settings.publish_every_steps, settings.publish_every_s, taken_at=0.0)
        self.forked = False
        self.closing = threading.Event()
        self.starter: threading.Thread | None = None
        self.start_failed: str | None = None
        self.worker = ThreadWorker(self)

    def take_reports(self, settle: bool = False) -> dict[str, Mapping[str, Any]]:
        """What the collector handed over last (the mailbox's terms settle nothing)."""
        return dict(self.terms[0].report_shard_state())

    def start(self) -> None:
        """Register, claim and start the network loop (in the background while the store is away)."""
        launch(self, self.worker)

    def stop(self, cause: str) -> None:
        """Stop the network loop, the lease given up for ``cause``."""
        self.worker.stop(False, time.monotonic() + 1.0, cause)


def _exit_with_collector(lifeline: int) -> None:
    """Exit when the collector's process is gone: the pipe's write end is closed by its death (or
    its stop()), whichever of its threads started us."""

    def wait() -> None:
        while True:
            try:
                if not os.read(lifeline, 64):
                    os._exit(0)
            except InterruptedError:
                continue
            except OSError:
                os._exit(0)

    threading.Thread(target=wait, name="redisync-sidecar-lifeline", daemon=True).start()


def _status(worker: ThreadWorker) -> dict[str, Any]:
    status = worker.status()
    keep = {k: status[k] for k in ("announced", "subscribed", "problem", "schema_mismatch", "latency", "stats")}
    return keep | {"latencies_ms": list(worker.latencies_ms)[-STATUS_LATENCIES:]}


def _yield_to_the_collector() -> None:
    """A batch process (Linux's SCHED_BATCH): waking up, it never preempts its collector (a preempted
    hot path shows at the tail), yet on a saturated CPU it keeps a fair share. A nice-10 sidecar got
    ~2 % of a core with every core busy and needed ~5.5 s for its last publish and exit, past a 5 s
    stop(); a nice value cannot be lowered again without privileges, so the stop cannot win it back."""
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    else:
        os.nice(NICE)


def serve(config: dict[str, Any]) -> None:
    """The sidecar's loop: take new reports from the outbox, hand new fleet states to the inbox."""
    _exit_with_collector(config["lifeline"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the collector: it stops us when it is done
    _yield_to_the_collector()
    name, sizes = config["mailbox"]
    box = Mailbox.attach(name, sizes)
    header = box.header
    url, run_kwargs = config["connect"]
    store = connect(url, run=config["run"], **run_kwargs)
    schema = Schema.model_validate_json(config["schema"])
    shared = None if config["shared"] is None else SidecarState(config["shared"])
    term = MailboxTerm(schema, box, shared)
    relay = Relay(store, config, term, header)
    cadence = None if shared is None or not shared.parts else SharedCadence(shared, header, relay.cadence)
    worker = relay.worker
    # continue where an earlier sidecar of this collector left off (nothing of it lives in this process)
    handed = unpack_handed(header[HANDED])
    if handed is not None:
        relay.shard.continue_from(*handed)
    relay.shard.seq = header[SEQ]
    relay.start()
    header[HEARTBEAT_MS] = int(time.monotonic() * 1e3)  # (first: from now on its heartbeat is judged)
    header[SIDECAR_PID] = os.getpid()  # serving: the collector's start() returns
    sequenced = False  # continue the shard's sequence numbers above the server's and any reserved
    taken = 0  # the outbox is read again: a report an earlier sidecar took may never have reached the store
    next_status = next_retry = 0.0
    while True:
        now = time.monotonic()
        header[HEARTBEAT_MS] = int(now * 1e3)
        stop = header[STOP]
        if not sequenced and now >= next_retry:
            try:
                relay.shard.seq = max(relay.shard.seq, relay.shard.last_folded_seq())
                header[INCARNATION] = relay.shard.incarnation + 1
                sequenced = True
            except errors.RedisyncError as e:
                log.info("sidecar shard %d: the store is not answering yet (%s)", relay.shard.shard_id, e)
                next_retry = now + relay.settings.retry_every_s
        fresh = False
        got = box.read_vectors(OUTBOX, taken) if sequenced else None
        if got is not None:
            taken, vectors = got
            term.copied, fresh = term.codec.decode(vectors), True
        if cadence is not None and sequenced and (stop == 1 or cadence.due(now, worker.pending())):
            reports = cadence.take(now)
            if reports is not None:
                term.shared, fresh = (
                    {
                        name: {
                            part: v if type(v) is float else term.codec.shaped(name, part, v)
                            for part, v in parts.items()
                        }
                        for name, parts in reports.items()
                    },
                    True,
                )
        if fresh:
            worker.flush()
        if stop:
            # the last report was handed to the worker just above: wait for it to be published. Not
            # stop(flush=True), which would hand the same report over again as a new object, and the
            # worker would publish it twice if the first copy were already on its way
            deadline = now + 3.0
            while stop == 1 and worker.pending() and time.monotonic() < deadline:
                time.sleep(LOOP_S)
            answered = not worker.pending()
            relay.stop(STOP_CAUSES[int(header[STOP_CAUSE])])
            if answered:
                header[DONE] = taken
                if cadence is not None:
                    header[FLUSHED] = cadence.covered
            box.write(STATUS, _status(worker))
            break
        if not worker.pending():  # the store answered for everything taken so far
            header[DONE] = taken
            if cadence is not None:
                header[FLUSHED] = cadence.covered
        worker.at_reset_boundary()  # a new fleet state goes to the inbox
        if now >= next_status:
            box.write(STATUS, _status(worker))
            next_status = now + STATUS_EVERY_S
        time.sleep(LOOP_S)
    box.close()


def main() -> None:
    """The sidecar process's entry point: read its configuration from stdin and serve."""
    config = pickle.load(sys.stdin.buffer)
    logging.basicConfig(level=logging.WARNING, format=f"redisync sidecar {os.getpid()}: %(levelname)s %(message)s")
    serve(config)
