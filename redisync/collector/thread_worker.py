"""The thread worker: the network of a collector's sync runs in two threads of its own process.

The collector hands its latest reports over (``on_step``) without a lock: it writes them, then
counts the hand-over; the worker publishes the newest when it wakes — a report not sent yet is
replaced by the next, which is exact because reports are cumulative — and pulls the fleet state
as soon as the run's channel announces a new version (polling every ``poll_every_s`` while the
subscription is down), at most once per ``min_pull_interval_s``. ``at_reset_boundary`` swaps the
already-decoded state into the terms.

If the store loses the run (a restart without persistence: a new epoch), the worker registers the
schema again and re-publishes the shard's latest cumulative reports, which re-seeds the merge keys
exactly. The sidecar process runs this worker too (`redisync.collector.sidecar_process`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..store.client import ShardClient, Store
from ..store.codec import PullResult
from ..store.schema import Limits
from ..store.subscription import SUBSCRIBED, Subscription
from .worker import Host, claim, join_start, log

LOST_SAID_EVERY_S = 60.0  # a lost connection is logged at most once a minute
WINDOW_MARGIN_S = 0.01  # past an announcement window's end: when a follower that heard it open looks once
# the worker's counters (see Syncer.metrics); zombie_dropped: reports not sent, a later process holds the
# shard and the store would refuse them
STATS = (
    "publishes",
    "duplicates",
    "coalesced",
    "publish_failures",
    "rejected",
    "pulls",
    "pull_failures",
    "reseeds",
    "subscription_drops",
    "worker_errors",
    "zombie_dropped",
)


class Wake:
    """A threading.Event for the worker's wake-up whose set() a signal handler may call at any moment
    (a trainer's SIGINT/SIGTERM handler calling flush() or stop() while on_step() was handing a report
    over). An Event's set() takes a lock: a handler that interrupted one in the same thread waited on
    it for ever, and a re-entrant lock would still hold the worker up until the handler returned.
    SimpleQueue's put() is reentrant C code, so set() never waits and never blocks the worker."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        """Wake the worker (reentrant: safe from a signal handler)."""
        self._queue.put(None)

    def clear(self) -> None:
        """Forget wake-ups not yet taken."""
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a wake-up, at most ``timeout`` seconds; whether one came."""
        try:
            self._queue.get(timeout=timeout)
        except queue.Empty:
            return False
        return True


class ThreadWorker:
    """Publishes the hand-overs and prefetches the fleet state in a worker thread, follows the run's
    channel in a listener thread (`redisync.collector.worker.Worker`).

    What crosses threads (the collector's, the worker, the listener, the start's; no lock but the one
    named): the hand-over — ``_latest`` then ``_reports_handed``, written by the collector (in that order),
    ``_reports_sent`` by the worker; the fleet state — ``_ready`` / ``_ready_at`` written by the worker,
    taken by the collector into ``_applied`` (its own); what was heard — ``_announced``,
    ``_announced_epoch``, ``_listened`` under ``_announcing`` (the listener and the worker);
    ``_subscribed`` / ``_subscriptions`` written by the listener, read by the worker and by ``status()``;
    ``_window_check_at`` set by either; ``_registered``, ``_run_limits``, ``_zombie``,
    ``_schema_mismatch``, ``_unreachable_since``, ``stats`` and ``latencies_ms`` written by the worker
    (and the start's thread before it runs), read by ``status()``. ``_stop`` and ``_wake`` are safe from
    any thread, ``_wake.set()`` even from a signal handler."""

    keepalive_s = 10.0  # a quiet subscription is PINGed after this long, and replaced after as long again

    def __init__(self, syncer: Host):
        self.syncer = syncer
        self.store, self.shard = syncer.store, syncer.shard
        self.problems = syncer.problems
        self._lease_due = 0.0
        self._wake = Wake()
        self._stop = threading.Event()
        self._stop_cause = "clean"  # why the lease is given up at the stop (lifeline.STOP_CAUSES)
        # The hand-over takes no lock (a signal handler's flush() may interrupt one in this thread): the
        # collector writes _latest, then counts it in _reports_handed; the worker, alone, moves _reports_sent up to the
        # hand-overs it has published. A report is pending while _reports_handed > _reports_sent (latest wins).
        self._latest: dict[str, Mapping[str, Any]] | None = None  # the last reports taken, to re-seed
        self._reports_handed = 0
        self._reports_sent = 0
        self._ready: PullResult | None = None  # decoded by the worker, applied at the reset boundary
        self._ready_at = 0.0
        self._applied: PullResult | None = None
        self._announced = 0
        self._announced_epoch: str | None = None  # the epoch of the last announcement or result
        # the listener, the worker's folds and its pulls all move the pair (_hear): one at a time, so
        # none overwrites what another heard meanwhile
        self._announcing = threading.Lock()
        self._listened = 0  # announcements heard on the channel so far (a pull forgets only older ones)
        self._unreachable_since: float | None = None  # when the store stopped answering (None: it answers)
        self._run_limits: Limits | None = None  # the run's limits, read at the first registration
        self._window_check_at: float | None = None  # when an announcement window heard open closes
        self._lost_said_at = -math.inf
        self._subscribed = False
        self._shard_channel = True  # the listener follows the run's shard channel (False: its role may not)
        self._subscriptions = 0  # subscriptions confirmed so far: after each, a pull is owed (what came before it)
        self._pulled_after = 0  # the subscription the last pull came after
        self._registered = False
        self.stats = dict.fromkeys(STATS, 0)
        self._zombie: str | None = None  # a later process claimed the shard: for ever, whatever else works
        self._schema_mismatch: errors.SchemaMismatch | None = None
        self.latencies_ms: deque[float] = deque(maxlen=10_000)  # the most recent publishes
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ the collector's side (no network)

    def on_step(self) -> None:
        """Hand the reports over when a publish is due."""
        if self.syncer.cadence.step():
            self._take_reports()

    def at_reset_boundary(self) -> tuple[int, float] | None:
        """Apply the newest state the worker decoded, if the terms have not had it yet."""
        ready = self._ready
        if ready is None or ready is self._applied:
            return None
        for term in self.syncer.terms:
            term.apply_shard_state(ready)
        self._applied = ready
        return ready.fleet_version, self._ready_at

    def flush(self) -> bool:
        """Hand the current reports over now."""
        self._take_reports(settle=True)
        return not self._stop.is_set()

    def synced(self, at_least: int) -> bool:
        """Published, and a state of version ``at_least`` (and of every announced one) ready."""
        ready = self._ready
        if not self.pending() and ready is not None and ready.fleet_version >= max(at_least, self._announced):
            return True
        self._wake.set()
        return False

    def _take_reports(self, settle: bool = False) -> None:
        reports = self.syncer.take_reports(settle)
        if reports:
            self._hand_over(reports)

    def _hand_over(self, reports: dict[str, Mapping[str, Any]]) -> None:
        if self._reports_handed > self._reports_sent:
            self.stats["coalesced"] += 1
        self._latest = reports
        self._reports_handed += 1  # (after the reports: a worker that sees the count sees reports at least as new)
        self._wake.set()

    def pending(self) -> bool:
        """Whether a report handed over is still waiting to be published."""
        return self._reports_handed > self._reports_sent

    # ------------------------------------------------------------------ life cycle

    def prepare(self) -> None:
        """Nothing: the threads need nothing before the hot path runs."""

    def rehome(self, store: Store, shard: ShardClient) -> None:
        """Publish as ``shard`` of ``store`` from now on (the run is split: the shard's sub-run)."""
        self.store, self.shard = store, shard

    def register(self) -> None:
        """Register the schema and claim the shard (see `redisync.collector.worker.claim`), then lease it."""
        self._register()

    def start(self) -> None:
        """The worker and the listener threads."""
        shard_id = self.shard.shard_id
        self._threads = [
            threading.Thread(target=self._work, name=f"redisync-worker-{shard_id}", daemon=True),
            threading.Thread(target=self._listen, name=f"redisync-listener-{shard_id}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def after_fork(self) -> None:
        """The threads did not come along into the child; it must never publish for its parent."""
        self._threads = []
        self._announcing = threading.Lock()  # (a worker thread of the parent may have held it)
        self._stop.set()

    def stop(self, flush: bool, deadline: float, cause: str) -> bool:
        """A last publish of the current reports (when ``flush``), then the threads stop (daemon
        threads stuck on an unresponsive server end on their own)."""
        join_start(self.syncer, deadline)
        if flush:
            self._take_reports(settle=True)
            while self.pending() and time.monotonic() < deadline and any(t.is_alive() for t in self._threads):
                time.sleep(0.01)
        self._stop_cause = cause
        self.syncer.closing.set()
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.pending():
            log.warning("redisync shard %d: stopped with the last report not published", self.shard.shard_id)
            return False
        return True

    def status(self) -> dict[str, Any]:
        """The announced version, the subscription, the current problem, publish latencies and counters."""
        latency: dict[str, float] = {}
        if self.latencies_ms:
            recent = sorted(self.latencies_ms)
            latency = {
                "publish_latency_ms": self.latencies_ms[-1],
                "publish_latency_ms_p50": recent[len(recent) // 2],
                "publish_latency_ms_p99": recent[int(0.99 * (len(recent) - 1))],
            }
        mismatch = self._schema_mismatch
        return {
            "announced": self._announced,
            "subscribed": self._subscribed,
            "problem": self._zombie or self.problems.current,
            "schema_mismatch": None if mismatch is None else str(mismatch),
            "latency": latency,
            "stats": dict(self.stats),
        }

    # ------------------------------------------------------------------ the worker (network)

    def _work(self) -> None:
        s = self.syncer
        last_pull = 0.0
        wanted = False  # a pull is owed (an announcement or our own publish) but came too soon
        while not self._stop.is_set():
            timeout = s.settings.poll_every_s if self._registered else s.settings.retry_every_s
            if wanted:
                timeout = max(0.0, last_pull + s.settings.min_pull_interval_s - time.monotonic())
            if self._registered:
                timeout = min(timeout, max(0.0, self._lease_due - time.monotonic()))
            check_at = self._window_check_at
            if check_at is not None:
                timeout = min(timeout, max(0.0, check_at - time.monotonic()))
            self._wake.wait(timeout)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not self._registered and not self._attempt("register", self._register):
                continue
            if time.monotonic() >= self._lease_due and self._zombie is None:
                self._attempt("lease", self._renew_lease)
            # a failed publish never stops the pulls: the view follows the store whatever happens to our reports
            published = self._attempt("publish", self._publish_pending)
            wanted = wanted or bool(published) or self._announced_newer()
            wanted = wanted or self._pulled_after != self._subscriptions
            check_at = self._window_check_at
            if check_at is not None and time.monotonic() >= check_at:  # a window heard open has closed
                self._window_check_at, wanted = None, True
                self._attempt("announce", self._pay_owed)
            since = time.monotonic() - last_pull
            # polled only while the subscription is down: a live one announces every new version
            due = (since >= s.settings.poll_every_s and not self._subscribed) or (
                wanted and since >= s.settings.min_pull_interval_s
            )
            if due and self._attempt("pull", self._pull) is not None:
                last_pull, wanted = time.monotonic(), False
            if self.problems.current is not None:
                self._stop.wait(s.settings.retry_every_s)
                self._wake.set()  # try again: the pending report is still there
        if self._registered and self._zombie is None and not s.forked:  # stopped: the shard id is free at once
            self._attempt(
                "lease", lambda: self.store.lease(self.shard.shard_id, self.shard.incarnation, 0, self._stop_cause)
            )

    def _register(self) -> bool:
        self._run_limits = claim(self.syncer, self._run_limits)
        self._registered = True
        self._renew_lease()
        return True

    def _renew_lease(self) -> None:
        """Tell the store this process lives (a second one started with our shard id is refused)."""
        lease_s = self.syncer.settings.lease_s
        self._lease_due = time.monotonic() + lease_s / 5
        if not self.store.lease(self.shard.shard_id, self.shard.incarnation, max(1, int(lease_s * 1e3))):
            self._became_zombie("the store holds a later claim of the shard")

    def _became_zombie(self, why: str) -> None:
        if self._zombie is None:
            log.error("redisync shard %d: a later process claimed this shard: %s", self.shard.shard_id, why)
        self._zombie = (
            f"zombie: a later process claimed shard {self.shard.shard_id}, so this one's reports are "
            f"refused ({why}); give each collector its own shard id (REDISYNC_SHARD)"
        )

    def _attempt(self, what: str, call: Any) -> Any:
        """Run one step of the worker; a failure is counted and logged once per change, never raised.
        A step that returns False did nothing on the network (nothing to publish): it says nothing about
        the store, so it does not end an outage."""
        try:
            result = call()
        except errors.RunNotFound:
            self._registered = False
            self._reseed()
            return None
        except errors.SchemaMismatch as e:
            self._schema_mismatch = e
            self.problems.report(f"{what}: {e}", logging.ERROR)
            return None
        except errors.ConnectionUnavailable as e:
            self.stats["publish_failures" if what == "publish" else "pull_failures"] += 1
            self._lost_store(e)
            self.problems.report(f"{what}: store unavailable: {e}", logging.INFO)
            return None
        except errors.InvalidReport as e:  # a report refused: said until one is published again
            self.problems.report(f"{what}: {e}", logging.WARNING)
            if what == "publish":  # counted after it is said: a reader that sees the count sees its reason
                self.stats["rejected"] += 1
            return None
        except Exception as e:  # the worker must outlive any surprise; the collector keeps training
            self.stats["worker_errors"] += 1
            self.problems.report(f"{what}: {type(e).__name__}: {e}", logging.ERROR, exc=True)
            return None
        if what == "register":
            self._schema_mismatch = None
            self.problems.clear("start")
        self.problems.clear(what)
        if self._unreachable_since is not None and result is not False:
            log.warning(
                "redisync shard %d: the store answers again after %.1f s",
                self.shard.shard_id,
                time.monotonic() - self._unreachable_since,
            )
            self._unreachable_since = None
        return result

    def _lost_store(self, error: BaseException) -> None:
        """A lost connection, said once per outage (and at most once a minute: a flapping link is not
        a flood of lines); its end is said too. The collector trains on meanwhile."""
        if self._unreachable_since is not None:
            return
        now = time.monotonic()
        self._unreachable_since = now
        if now - self._lost_said_at >= LOST_SAID_EVERY_S:
            self._lost_said_at = now
            log.warning(
                "redisync shard %d: the store is unreachable (%s): reports wait and are sent when it answers, "
                "the collector trains on",
                self.shard.shard_id,
                error,
            )

    def _publish_pending(self) -> bool:
        handed, reports = self._reports_handed, self._latest
        if handed <= self._reports_sent or reports is None:
            return False
        if self._zombie is not None:  # every report would be refused and dead-lettered: none is sent
            self._reports_sent = max(self._reports_sent, handed)
            self.stats["zombie_dropped"] += 1
            return False
        t = time.perf_counter()
        refused = None
        try:
            result = self.shard.publish(reports)
        except (
            errors.InvalidReport
        ) as e:  # refused (and dead-lettered by the store); the next report carries everything
            result, refused = None, e  # (counted once health() says it: see _attempt)
            if isinstance(e, errors.StaleIncarnation):  # for ever: no report of this process can reach the store again
                self._became_zombie(str(e))
            if isinstance(e, errors.SchemaDigestMismatch):
                self._registered = False  # the run was registered again with another schema: find out which
        self._reports_sent = max(self._reports_sent, handed)
        if refused is not None:
            raise refused  # health() says it until a report is published again (_attempt)
        if result is not None:
            self.latencies_ms.append((time.perf_counter() - t) * 1e3)
            self.stats["publishes" if result.applied else "duplicates"] += 1
            self._hear(result.fleet_version, result.epoch)
        return True

    def _pull(self) -> bool:
        seen_before, after, listened = self.shard.known is not None, self._subscriptions, self._listened
        # announced: the state moved, one call reads it; else a plain read of the version first
        changed = self.shard.pull(check_first=not self._announced_newer())
        self._pulled_after = after
        if changed is not None and changed.epoch_changed and self._registered and self._zombie is None:
            # a new epoch: the store may have lost our lease with the rest (another process re-registered
            # the run first); renewed before the new state counts as seen, so no second process started
            # with our shard id finds it free meanwhile
            self._attempt("lease", self._renew_lease)
        if changed is not None and ((changed.epoch_changed and seen_before) or changed.lost_writes):
            self._republish_latest()  # a new epoch, or lost writes: our slots may be missing or old
        if changed is not None and changed.lost_writes:
            return True  # not applied: the state is older than one applied already; the re-publish moves it on
        if changed is not None:
            self.stats["pulls"] += 1
            known = self.shard.known
            assert known is not None  # (a changed pull has set it)
            self._ready, self._ready_at = known, time.monotonic()
            # (an announcement of this epoch heard while the pull was on its way stays: the first
            # pull's epoch is always new to the shard, not to the listener)
            self._hear(known.fleet_version, known.epoch)
        self._forget_false_announcements(listened)
        return True

    def _forget_false_announcements(self, listened: int) -> None:
        """Announcements are hints, never facts: a pull that found the store behind what was announced
        before it began (a higher version, another epoch) forgets it, so a forged or stray message on
        the channel costs at most one pull, and wait_synced() and staleness go by the store again.
        One heard while the pull was on its way stays (it may be newer than what the pull read)."""
        known = self.shard.known
        if known is None:
            return
        with self._announcing:
            if self._listened != listened:
                return
            if self._announced > known.fleet_version or self._announced_epoch not in (None, known.epoch):
                log.debug(
                    "shard %d: the store is at version %d of epoch %s, not the announced %d of %s: forgotten",
                    self.shard.shard_id,
                    known.fleet_version,
                    known.epoch,
                    self._announced,
                    self._announced_epoch,
                )
                self._announced, self._announced_epoch = known.fleet_version, known.epoch

    def _hear(self, version: int, epoch: str | None) -> None:
        """A version of ``epoch`` announced on the channel, returned by our own fold or pulled: the
        highest of the epoch is kept; another epoch's versions start over (a run lost and registered
        again counts from 0). One at a time: the listener and the worker both tell it."""
        with self._announcing:
            if epoch and epoch != self._announced_epoch:
                self._announced, self._announced_epoch = version, epoch
            else:
                self._announced = max(self._announced, version)

    def _pay_owed(self) -> None:
        """Pay what the window left owed, if its debtor has not (it died, or stopped): every follower
        then hears the burst's last version, and the run's meta owes nothing. The server keeps the
        window: too early (a later announcement opened another), this looks again when that closes."""
        wait = self.store.owed_wait_s()
        if wait:
            self._window_check_at = time.monotonic() + wait + WINDOW_MARGIN_S

    def _window_opened(self) -> None:
        """An announcement heard on a run with an announcement window: versions folded in the next
        window may be announced late, or never, if the process whose fold owes it dies; one look when
        the window closes finds them (a plain read of the version when nothing moved)."""
        limits = self._run_limits
        if limits is None or limits.announce_every_s <= 0:
            return
        # (a look still pending is for an earlier window: this announcement carries every version
        # folded before it, so only the window it opens needs the look)
        self._window_check_at = time.monotonic() + limits.announce_every_s + WINDOW_MARGIN_S
        self._wake.set()

    def _announced_newer(self) -> bool:
        """Whether what the worker heard (the channel, its own folds) is newer than the state it holds:
        a higher version, or another epoch (a run lost and registered again starts its versions over)."""
        known = self.shard.known
        if known is None:
            return True
        return self._announced > known.fleet_version or self._announced_epoch not in (None, known.epoch)

    def _reseed(self) -> None:
        """The store lost the run: register again and re-publish our latest cumulative reports."""
        log.warning("run %r lost by the store: re-seeding from shard %d", self.store.run, self.shard.shard_id)
        if self._attempt("register", self._register):
            self._republish_latest()

    def _republish_latest(self) -> None:
        self.stats["reseeds"] += 1
        if self._latest is not None:
            self._reports_sent = min(
                self._reports_sent, self._reports_handed - 1
            )  # (the worker's own counter: no lock needed)
        self._wake.set()

    def _listen(self) -> None:
        """Follow the run's versions channel (`redisync.store.subscription`); a new version wakes
        the worker. Polling covers the gaps: a subscription that drops, or answers no PING, is
        replaced after ``retry_every_s``."""
        retry_every_s = self.syncer.settings.retry_every_s
        while not self._stop.is_set():
            subscription = Subscription(self.store, self._shard_channel, self.keepalive_s)
            try:
                subscription.open()
                while not self._stop.is_set():
                    heard = subscription.next()
                    if heard is None:
                        continue
                    what, message = heard
                    if what == SUBSCRIBED:  # every channel confirmed: nothing is missed
                        self._subscribed = True
                        self._subscriptions += 1  # what changed before it was not announced to us: a pull is owed
                        self._wake.set()
                        continue
                    version, _, epoch = message.partition(" ")  # '<fleet_version> <epoch>'
                    if not (version.isdigit() and epoch and " " not in epoch):
                        log.debug("shard %d: a garbled announcement ignored: %r", self.shard.shard_id, message)
                        continue
                    with self._announcing:
                        self._listened += 1
                    self._hear(int(version), epoch)
                    self._window_opened()
                    if self._announced_newer():
                        self._wake.set()
            except Exception as e:  # a dropped subscription must never end the listener
                log.debug("subscription dropped: %s", e)
                if Subscription.shard_channel_refused(e):
                    self._shard_channel = False  # the role may not: the plain channel only
                if self._subscribed:
                    self.stats["subscription_drops"] += 1
                self._subscribed = False
                self._stop.wait(retry_every_s)
            finally:
                with contextlib.suppress(Exception):
                    subscription.close()
