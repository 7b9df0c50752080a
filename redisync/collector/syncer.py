"""The loop glue of one collector: its terms' state goes through the store off the hot path.

``on_step()`` and ``at_reset_boundary()`` never touch the network. A background worker publishes
the latest reports every ``publish_every_steps`` steps or ``publish_every_s`` seconds — a report
that was not sent yet is replaced by the next one, which is exact because merge reports are
cumulative — and pulls the fleet state as soon as the run's channel announces a new version
(polling every ``poll_every_s`` when the subscription is down), at most once per
``min_pull_interval_s`` however busy the fleet is. The reset boundary then only swaps the
already-decoded state into the terms, so a collector applies a new fleet state a few times a
second at most, whatever the number of shards.

If the store loses the run (a restart without persistence: a new epoch), the worker registers
the schema again and re-publishes the shard's latest cumulative reports, which re-seeds the
merge keys exactly.

Life cycle: the shard's incarnation is claimed from the server at ``start()``. A term that was
loaded from a checkpoint holding its own cumulative statistics says so (``term.resumed``, set by
its ``load_state_dict``), and its keys then take over the previous life's slots instead of adding
to them; ``resume=True``/``False`` overrides that for every key.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, cast

from .. import errors
from ..store.client import Store
from ..store.codec import PullResult
from ..store.schema import Limits
from .seam import SyncedTerm, schema_of

log = logging.getLogger(__name__)

LOST_SAID_EVERY_S = 60.0  # a lost connection is logged at most once a minute
LEASE_S = 5.0  # the default lease: a live process renews it every fifth of it (a dead one's runs out)
_live: weakref.WeakSet[Syncer] = weakref.WeakSet()  # started and not stopped: a forked child detaches them


def _detach_in_forked_child() -> None:
    for syncer in list(_live):
        syncer._after_fork_in_child()
    _live.clear()


os.register_at_fork(after_in_child=_detach_in_forked_child)


def _text(data: Any) -> str:
    return data.decode() if isinstance(data, bytes) else str(data)


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


def report_of(term: SyncedTerm, settle: bool = False) -> Mapping[str, Mapping[str, Any]]:
    """A term's report; with ``settle`` (a flush, a stop: never the hot path) its current one, from
    a term whose state lives on a device and whose hot-path reports lag by a publish (``settle()``)."""
    settled = getattr(term, "settle", None) if settle else None
    return settled() if settled is not None else term.report_shard_state()


class Syncer:
    """A collector's sync: publishes its terms' reports and prefetches the fleet state in the
    background, hands the state over at reset boundaries; the network runs in a thread of this
    process (the thread worker). `new_syncer` picks the worker —
    this one, or the sidecar process (`SidecarSyncer`, the same
    API) — and is what to call."""

    keepalive_s = 10.0  # a quiet subscription is PINGed after this long, and replaced after as long again

    def __init__(
        self,
        store: Store,
        shard_id: int,
        terms: Sequence[SyncedTerm],
        *,
        publish_every_steps: int = 50,
        publish_every_s: float = 1.0,
        poll_every_s: float = 1.0,
        min_pull_interval_s: float = 0.1,
        retry_every_s: float = 0.5,
        incarnation: int | None = None,
        resume: bool | frozenset[str] | None = None,
        start_timeout_s: float = 5.0,
        take_over: bool = False,
        lease_s: float = LEASE_S,
    ):
        if not lease_s > 0:
            raise errors.ConfigurationError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
        self.store = store
        self.terms = list(terms)
        self._reporting = self.terms  # the terms whose reports this process builds (the process worker shares some)
        self.schema = schema_of(self.terms)
        self.shard = store.shard(shard_id, incarnation)
        self.resume = resume
        self.publish_every_steps, self.publish_every_s = publish_every_steps, publish_every_s
        self.poll_every_s, self.retry_every_s = poll_every_s, retry_every_s
        self.min_pull_interval_s = min_pull_interval_s
        self.start_timeout_s = start_timeout_s
        self.take_over = take_over
        self.lease_s = lease_s
        self._lease_due = 0.0
        self._forked = False  # this object was inherited by a forked child: it must not touch the parent's sync
        self._wake = Wake()
        self._stop = threading.Event()
        # The hand-over takes no lock (a signal handler's flush() may interrupt one in this thread): the
        # collector writes _latest, then counts it in _reports_handed; the worker, alone, moves _reports_sent up to the
        # hand-overs it has published. A report is pending while _reports_handed > _reports_sent (latest wins).
        self._latest: dict[str, Mapping[str, Any]] | None = None  # the last reports taken, to re-seed
        self._reports_handed = 0
        self._reports_sent = 0
        self._ready: PullResult | None = None  # decoded by the worker, applied at the reset boundary
        self._ready_at = 0.0
        self._applied: PullResult | None = None
        self._applied_version = 0
        self._applied_at = time.monotonic()
        self._announced = 0
        self._announced_epoch: str | None = None  # the epoch of the last announcement or result
        # the listener, the worker's folds and its pulls all move the pair (_hear): one at a time, so
        # none overwrites what another heard meanwhile
        self._announcing = threading.Lock()
        self._listened = 0  # announcements heard on the channel so far (a pull forgets only older ones)
        self._unreachable_since: float | None = None  # when the store stopped answering (None: it answers)
        self._run_limits: Limits | None = None  # the run's limits, read at the first registration
        self._lost_said_at = -math.inf
        self._steps = 0
        self._last_report = time.monotonic()
        self._subscribed = False
        self._subscriptions = 0  # subscriptions confirmed so far: after each, a pull is owed (what came before it)
        self._pulled_after = 0  # the subscription the last pull came after
        self._registered = False
        self.stats = {
            "publishes": 0,
            "duplicates": 0,
            "coalesced": 0,
            "publish_failures": 0,
            "rejected": 0,
            "pulls": 0,
            "pull_failures": 0,
            "reseeds": 0,
            "subscription_drops": 0,
            "worker_errors": 0,
            "zombie_dropped": 0,  # reports not sent: a later process holds the shard, the store would refuse them
        }
        self._problem: str | None = None  # the current error, logged once per change
        self._zombie: str | None = None  # a later process claimed the shard: for ever, whatever else works
        self._schema_mismatch: errors.SchemaMismatch | None = None
        self.latencies_ms: deque[float] = deque(maxlen=10_000)  # the most recent publishes
        self._threads: list[threading.Thread] = []
        self._starter: threading.Thread | None = None
        self._start_failed: str | None = None  # why the worker could not start (then nothing is published)

    # ------------------------------------------------------------------ the collector's side (no network)

    def on_step(self) -> None:
        """Once per env step: counts, and hands over the reports when a publish is due."""
        self._steps += 1
        if self._steps >= self.publish_every_steps or time.monotonic() - self._last_report >= self.publish_every_s:
            self._take_reports()

    def at_reset_boundary(self) -> bool:
        """Swap the newest fleet state into the terms; True if one was applied."""
        ready = self._ready
        if ready is None or ready is self._applied:
            return False
        for term in self.terms:
            term.apply_shard_state(ready)
        self._applied, self._applied_at, self._applied_version = ready, self._ready_at, ready.fleet_version
        return True

    def flush(self) -> bool:
        """Hand over the current reports now (e.g. before a checkpoint or at the end of training);
        False when no worker can publish them (it could not start, or stopped)."""
        self._take_reports(settle=True)
        return self._start_failed is None and not self._stop.is_set()

    def wait_synced(self, at_least: int = 0, timeout: float = 10.0) -> bool:
        """Block until our reports are published and a fleet state of version >= ``at_least`` (and
        >= every version announced so far) is ready to apply. For checkpoints, shutdown and tests —
        never on the hot path."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._start_failed is None:
            ready = self._ready
            if not self.has_pending() and ready is not None and ready.fleet_version >= max(at_least, self._announced):
                return True
            self._wake.set()
            time.sleep(0.01)
        return False

    def _take_reports(self, settle: bool = False) -> None:
        reports: dict[str, Mapping[str, Any]] = {}
        for term in self._reporting:
            reports.update(report_of(term, settle))
        self._steps, self._last_report = 0, time.monotonic()
        if reports:
            self._hand_over(reports)

    def _hand_over(self, reports: dict[str, Mapping[str, Any]]) -> None:
        if self._reports_handed > self._reports_sent:
            self.stats["coalesced"] += 1
        self._latest = reports
        self._reports_handed += 1  # (after the reports: a worker that sees the count sees reports at least as new)
        self._wake.set()

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
            resumed_keys = {k for t in self.terms if getattr(t, "resumed", False) for k in t.schema_entries()}
            self.shard.resume = frozenset(resumed_keys)
        else:
            self.shard.resume = resumed
        # a second live process with this shard id is refused, unless asked to, or resuming its checkpoint
        self.shard.take_over = self.take_over or bool(self.shard.resume)
        for term in self.terms:  # what a term makes before the hot path (on a device: its pinned buffers)
            prepare = getattr(term, "prepare", None)
            if callable(prepare):
                prepare()
        self._prepare_worker()
        registered, returned = threading.Event(), threading.Event()
        failure: list[BaseException] = []

        def register_then_start() -> None:
            try:
                self._register()  # the incarnation is claimed now, before this process publishes anything
                self._clear_problem("start")
            except errors.ConnectionUnavailable as e:
                log.info("store unavailable at start (the worker keeps trying): %s", e)
            except BaseException as e:  # raised by start() while it waits; shown by health() once it has returned
                failure.append(e)
                registered.set()
                if returned.is_set():
                    self._report_problem(f"start: {type(e).__name__}: {e}", logging.ERROR)
                return
            registered.set()
            if not self._stop.is_set():
                try:
                    self._start_worker()
                except BaseException as e:  # nothing would reach the store: said at once, never silent
                    self._start_failed = f"start: the worker could not start: {type(e).__name__}: {e}"
                    self._report_problem(self._start_failed, logging.ERROR, exc=True)

        self._starter = threading.Thread(
            target=register_then_start, name=f"redisync-start-{self.shard.shard_id}", daemon=True
        )
        self._starter.start()
        _live.add(self)
        if not registered.wait(self.start_timeout_s):
            returned.set()
            self._report_problem(
                f"start: the store did not answer within {self.start_timeout_s:g} s "
                "(registering and claiming the shard go on in the background)",
                logging.WARNING,
            )
            return self
        if failure:
            self.stop(flush=False, timeout=1.0)  # frees what the worker had prepared
            raise failure[0]
        self._starter.join()  # the worker's own start (a sidecar's is bounded by STARTUP_S)
        return self

    def _prepare_worker(self) -> None:
        """What the worker needs before the hot path runs, without the network (see the sidecar)."""

    def _start_worker(self) -> None:
        self._threads = [
            threading.Thread(target=self._work, name=f"redisync-worker-{self.shard.shard_id}", daemon=True),
            threading.Thread(target=self._listen, name=f"redisync-listener-{self.shard.shard_id}", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _after_fork_in_child(self) -> None:
        """This object was copied into a forked child: its threads did not come along, and it must
        never stop, publish for or write into its parent's sync. A child that wants to sync starts
        a Syncer of its own."""
        self._forked = True
        self._threads, self._starter = [], None
        self._announcing = threading.Lock()  # (a worker thread of the parent may have held it)
        self._stop.set()

    def stop(self, flush: bool = True, timeout: float = 5.0) -> bool:
        """Stop the worker, after a last publish of the current reports when ``flush``. Returns within
        ``timeout`` even against an unresponsive server (the daemon threads then end on their own):
        True when every report handed over reached the store, False when one did not (said in the log)."""
        if self._forked:
            return False  # the parent's sync: not ours to stop
        _live.discard(self)
        deadline = time.monotonic() + timeout
        if self._starter is not None and self._starter.is_alive():
            self._starter.join(max(0.0, deadline - time.monotonic()))
        if flush:
            self._take_reports(settle=True)
            while self.has_pending() and time.monotonic() < deadline and any(t.is_alive() for t in self._threads):
                time.sleep(0.01)
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self.has_pending():
            log.warning("redisync shard %d: stopped with the last report not published", self.shard.shard_id)
            return False
        return True

    def health(self) -> dict[str, Any]:
        """Whether the worker is getting through: ``ok``, the current ``error`` (None when ok) and
        ``schema_mismatch`` (the registered schema differs from this collector's, e.g. after the store
        restarted and another trainer registered the run first)."""
        status = self._worker_status()
        return {
            "ok": status["problem"] is None,
            "error": status["problem"],
            "schema_mismatch": status["schema_mismatch"],
        }

    def has_pending(self) -> bool:
        """Whether a report handed over is still waiting to be published."""
        return self._reports_handed > self._reports_sent

    def _worker_status(self) -> dict[str, Any]:
        """What the worker knows that the collector reports: the announced version, the subscription,
        the current problem, publish latencies and counters."""
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
            "problem": self._zombie or self._problem,
            "schema_mismatch": None if mismatch is None else str(mismatch),
            "latency": latency,
            "stats": dict(self.stats),
        }

    def __enter__(self) -> Syncer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ------------------------------------------------------------------ the worker (network)

    def _work(self) -> None:
        last_pull = 0.0
        wanted = False  # a pull is owed (an announcement or our own publish) but came too soon
        while not self._stop.is_set():
            timeout = self.poll_every_s if self._registered else self.retry_every_s
            if wanted:
                timeout = max(0.0, last_pull + self.min_pull_interval_s - time.monotonic())
            if self._registered:
                timeout = min(timeout, max(0.0, self._lease_due - time.monotonic()))
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
            since = time.monotonic() - last_pull
            # polled only while the subscription is down: a live one announces every new version
            due = (since >= self.poll_every_s and not self._subscribed) or (
                wanted and since >= self.min_pull_interval_s
            )
            if due and self._attempt("pull", self._pull) is not None:
                last_pull, wanted = time.monotonic(), False
            if self._problem is not None:
                self._stop.wait(self.retry_every_s)
                self._wake.set()  # try again: the pending report is still there
        if self._registered and self._zombie is None and not self._forked:  # stopped: the shard id is free at once
            self._attempt("lease", lambda: self.store.lease(self.shard.shard_id, self.shard.incarnation, 0))

    def _register(self) -> bool:
        """Register the schema and claim the shard's incarnation (a no-op once claimed). A shard
        whose holder's lease is fresh is refused (`ShardInUse`) as soon as
        the holder renews it; a crashed holder's lease is waited out (at most one lease)."""
        # the run's limits as first read: a store that lost the run gets them back, not the defaults
        self.store.register(self.schema, self._run_limits)
        if self._run_limits is None:
            with contextlib.suppress(errors.RedisyncError):  # (unreadable: the next registration reads them)
                self._run_limits = self.store.limits()
        deadline, held_until = time.monotonic() + self.lease_s + 1.0, None
        while True:
            try:
                _ = self.shard.incarnation  # (claimed by the property, refused while a live holder renews)
                break
            except errors.ShardInUse as e:
                until = time.monotonic() + e.remaining_ms / 1e3
                if (held_until is not None and until > held_until + 0.5) or until > deadline:
                    raise  # renewed meanwhile: a live process holds it
                held_until = until if held_until is None else max(held_until, until)
                time.sleep(min(e.remaining_ms / 1e3 + 0.05, self.lease_s / 15))  # three looks per renewal
        self._registered = True
        self._renew_lease()
        return True

    def _renew_lease(self) -> None:
        """Tell the store this process lives (a second one started with our shard id is refused)."""
        self._lease_due = time.monotonic() + self.lease_s / 5
        if not self.store.lease(self.shard.shard_id, self.shard.incarnation, max(1, int(self.lease_s * 1e3))):
            self._became_zombie("the store holds a later claim of the shard")

    def _became_zombie(self, why: str) -> None:
        if self._zombie is None:
            log.error("redisync shard %d: a later process claimed this shard: %s", self.shard.shard_id, why)
        self._zombie = (
            f"zombie: a later process claimed shard {self.shard.shard_id}, so this one's reports are "
            f"refused ({why}); give each collector its own shard id (REDISYNC_SHARD)"
        )

    def _attempt(self, what: str, call: Any) -> Any:
        """Run one step of the worker; a failure is counted and logged once per change, never raised."""
        try:
            result = call()
        except errors.RunNotFound:
            self._registered = False
            self._reseed()
            return None
        except errors.SchemaMismatch as e:
            self._schema_mismatch = e
            self._report_problem(f"{what}: {e}", logging.ERROR)
            return None
        except errors.ConnectionUnavailable as e:
            self.stats["publish_failures" if what == "publish" else "pull_failures"] += 1
            self._lost_store(e)
            self._report_problem(f"{what}: store unavailable: {e}", logging.INFO)
            return None
        except errors.InvalidReport as e:  # a report refused: said until one is published again
            self._report_problem(f"{what}: {e}", logging.WARNING)
            return None
        except Exception as e:  # the worker must outlive any surprise; the collector keeps training
            self.stats["worker_errors"] += 1
            self._report_problem(f"{what}: {type(e).__name__}: {e}", logging.ERROR, exc=True)
            return None
        if what == "register":
            self._schema_mismatch = None
            self._clear_problem("start")
        self._clear_problem(what)
        if self._unreachable_since is not None:
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

    def _report_problem(self, text: str, level: int, exc: bool = False) -> None:
        if text != self._problem:
            log.log(level, "redisync shard %d: %s (retrying)", self.shard.shard_id, text, exc_info=exc)
        self._problem = text

    def _clear_problem(self, what: str) -> None:
        if self._problem is not None and self._problem.startswith(what + ":"):
            log.info("redisync shard %d: %s works again", self.shard.shard_id, what)
            self._problem = None

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
            self.stats["rejected"] += 1
            result, refused = None, e
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
        """Follow the run's channel; a new version wakes the worker. Polling covers the gaps.

        A connection that carries nothing for ``keepalive_s`` is sent a PING; one that does not answer
        within another ``keepalive_s`` is taken for dead and replaced (a firewall or NAT that forgot an
        idle connection closes nothing: without the PING the listener would wait for ever, subscribed
        in name, and the worker would never poll)."""
        while not self._stop.is_set():
            pubsub = cast(Any, self.store.redis).pubsub()  # annotated in some redis-py versions only
            try:
                pubsub.subscribe(self.store.keys.channel)
                heard, pinged = time.monotonic(), None
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=0.2)
                    now = time.monotonic()
                    if msg:
                        heard, pinged = now, None  # anything at all: the connection lives
                    elif pinged is None and now - heard >= self.keepalive_s:
                        pubsub.ping()
                        pinged = now
                    elif pinged is not None and now - pinged >= self.keepalive_s:
                        raise ConnectionError(f"the subscription answered no PING within {self.keepalive_s:g} s")
                    if msg and msg.get("type") == "subscribe":  # confirmed: from here on, nothing is missed
                        self._subscribed = True
                        self._subscriptions += 1  # what changed before it was not announced to us: a pull is owed
                        self._wake.set()
                    elif msg and msg.get("type") == "message":
                        version, _, epoch = _text(msg["data"]).partition(" ")  # '<fleet_version> <epoch>'
                        if not (version.isdigit() and epoch and " " not in epoch):
                            log.debug("shard %d: a garbled announcement ignored: %r", self.shard.shard_id, msg["data"])
                            continue
                        with self._announcing:
                            self._listened += 1
                        self._hear(int(version), epoch)
                        if self._announced_newer():
                            self._wake.set()
            except Exception as e:  # a dropped subscription must never end the listener
                log.debug("subscription dropped: %s", e)
                if self._subscribed:
                    self.stats["subscription_drops"] += 1
                self._subscribed = False
                self._stop.wait(self.retry_every_s)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

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
        status = self._worker_status()
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
            term_metrics = getattr(term, "metrics", None)
            key = getattr(term, "key", None)
            if callable(term_metrics) and key:
                out.update({f"redisync/{key}/{k}": float(v) for k, v in term_metrics().items()})
        # terms on a device: the reports not started and the fleet states deferred because the device
        # was behind (each is caught up at a later publish or boundary; a count that keeps growing
        # says the device cannot keep up with the publish rate)
        copies = [counts() for term in self.terms if callable(counts := getattr(term, "device_copies", None))]
        for name in ("device_reports_skipped", "device_fleet_deferred"):
            if copies:
                out[f"redisync/{name}"] = float(sum(c.get(name, 0) for c in copies))
        return out
