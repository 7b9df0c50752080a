"""The shard protocol: a collector claims its shard, leases it, publishes its reports and pulls the fleet state.

`ShardProtocol` holds the run-level calls (claim, lease, pull); `ShardClient` is one collector's
side of them, with its sequence numbers and the fleet state it knows.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import numpy as np

from .. import errors
from . import codec
from .codec import as_text
from .connection import Connection, _translated, log
from .schema import Limits, encode_reports


class ShardProtocol(Connection):
    """The calls a collector's shard makes of its run, and the announcements its folds owe."""

    def shard(
        self,
        shard_id: int,
        incarnation: int | None = None,
        *,
        resume: bool | Iterable[str] = False,
        reserve: Callable[[int], None] | None = None,
    ) -> ShardClient:
        """The client of collector ``shard_id``. Without ``incarnation`` it claims a new one from the
        server at its first call; ``resume`` names the keys (True: all) this process resumed from a
        checkpoint holding its own cumulative statistics, whose previous slots it takes over;
        ``reserve`` is called with each sequence number before its fold is sent."""
        return ShardClient(self, shard_id, incarnation, resume=resume, reserve=reserve)

    @_translated
    def claim(self, shard_id: int, take_over: bool = True) -> int:
        """A new incarnation of ``shard_id``, issued by the server and above every earlier claim.
        Without ``take_over`` a shard whose holder's lease is fresh (a live process) is refused
        with `ShardInUse`."""
        reply = self._call(self.scripts.claim, [self.keys.meta, self.keys.shards], [shard_id, int(take_over)])
        if as_text(reply[0]) == "no_run":
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        if as_text(reply[0]) == "in_use":
            raise errors.ShardInUse(shard_id, as_text(reply[1]), int(as_text(reply[2])))
        return int(as_text(reply[1]))

    @_translated
    def lease(self, shard_id: int, incarnation: int, lease_ms: int, stop_cause: str = "clean") -> bool:
        """Renew ``incarnation``'s lease on ``shard_id`` (0 ms: give it up, recording ``stop_cause``:
        `lifeline.stop_cause`); False when a later process has claimed the shard."""
        args = [shard_id, incarnation, lease_ms] + ([stop_cause] if lease_ms == 0 else [])
        reply = self._call(self.scripts.lease, [self.keys.shards, self.keys.meta], args)
        return as_text(reply[0]) == "leased"

    @_translated
    def last_folded_seq(self, shard_id: int, incarnation: int) -> int:
        """The last sequence number folded for ``shard_id`` under ``incarnation`` (0 if none)."""
        inc, seq = self.redis.hmget(self.keys.shards, f"{shard_id}:incarnation", f"{shard_id}:seq")
        return int(seq) if inc is not None and seq is not None and int(inc) == incarnation else 0

    def pull(
        self,
        shard_id: int | None = None,
        known: codec.PullResult | None = None,
        incarnation: int | None = None,
        resumed: Any = lambda name: False,
        check_first: bool = False,
    ) -> codec.PullResult | None:
        """The state changed since ``known`` (all of it when None), with the slots of ``shard_id``'s
        ``incarnation`` (and of its previous life where its next fold takes them out: see ``parse_pull``).

        ``check_first``: read the run's epoch and fleet version first (one plain HMGET, about a PING)
        and call the pull function only when they moved: for a poll that expects no change. A caller
        that knows the state moved (an announcement on the versions channel) leaves it off."""
        schema = self.schema
        if check_first and known is not None and self._version() == codec.version_reply(known):
            return None
        args: list[Any] = ["" if shard_id is None else shard_id]
        if known is None:
            args += ["", -1] + [-1] * len(schema.keys)
        else:
            args += [known.epoch, known.fleet_version] + [
                known.keys[n].version if n in known.keys else -1 for n in schema.keys
            ]
        reply = self._call_read_only(self.scripts.pull, self._pull_keys, args)
        return codec.parse_pull(reply, schema, None if known is None else known.epoch, incarnation, resumed)

    @_translated
    def _version(self) -> Any:
        """The run's epoch and fleet version as stored (bytes; None where missing): one plain read."""
        return cast(Any, self.redis).execute_command(
            "HMGET", self.keys.meta, "epoch", "fleet_version"
        )  # annotated in some redis-py versions only

    def fold(self, keys: list[str], args: list[Any], names: tuple[str, ...]) -> tuple[codec.PublishResult, int]:
        """One fold's call (with a WAIT where ``wait_replicas`` asks for replicas): its result, and how
        many replicas hold it (0 when none are asked). An announcement it left owed is paid later."""
        if not self.wait_replicas:
            result, acked = codec.parse_publish(self._call(self.scripts.fold, keys, args), names), 0
        else:
            reply, acked = self._call_replicated(self.scripts.fold, keys, args)
            result = codec.parse_publish(reply, names)
        if result.owed_in_us is not None:
            self._pay_later(result.owed_in_us)
        return result, acked

    def fleet(self) -> codec.PullResult:
        """The whole fleet state, read-only (for the learner, logging and inspection)."""
        result = self.pull()
        assert result is not None
        return result

    @_translated
    def announce_owed(self) -> bool:
        """Announce the run's current version if a fold left its announcement owed (a run with
        ``Limits.announce_every_s``) and the window since the last announcement has passed; False
        when nothing was announced (nothing owed, or the window not over: `owed_wait_s` says)."""
        paid: bool = self.owed_wait_s() == 0.0
        return paid

    @_translated
    def owed_wait_s(self) -> float | None:
        """Pay an owed announcement: 0.0 when it announced now, None when nothing was owed, else the
        seconds left of the window (the debt stays; any client may pay it then)."""
        reply = self._call(self.scripts.announce, [self.keys.meta], [])
        if isinstance(reply, list):  # ['wait', µs]
            return max(int(as_text(reply[1])), 1) / 1e6
        return 0.0 if int(reply) == 1 else None

    def _pay_later(self, delay_us: int) -> None:
        """Announce what a fold left owed once the run's window has passed, from a timer thread (again
        when the server says the window is not over yet): a follower learns a burst's last version then.
        If this process is gone by then, the debt stays in the run's meta for any client to pay, and
        each follower that heard the window open looks once when it closes."""

        def pay() -> None:
            try:
                wait = self.owed_wait_s()
            except errors.RedisyncError as e:
                log.info(
                    "run %r: an owed announcement was not made (%s); followers' polls find the version", self.run, e
                )
                return
            if wait:  # (the window not over by the server's clock)
                later = threading.Timer(wait, pay)
                later.daemon = True
                later.start()

        timer = threading.Timer(delay_us / 1e6, pay)
        timer.daemon = True
        timer.start()


class ShardClient:
    """One collector's side of the store: publish its shard reports, pull the fleet state.

    Every publish takes the next sequence number, so a retry of the same call is recognised
    as a duplicate while a later, different report never is. Safe to share between threads:
    publishes are serialised, so folds arrive in sequence order.
    """

    def __init__(
        self,
        store: ShardProtocol,
        shard_id: int,
        incarnation: int | None = None,
        *,
        resume: bool | Iterable[str] = False,
        reserve: Callable[[int], None] | None = None,
    ):
        if not isinstance(shard_id, (int, np.integer)) or isinstance(shard_id, bool) or not 0 <= shard_id < 10**9:
            raise errors.MalformedReport(None, f"shard_id must be an int in [0, 1e9), got {shard_id!r}")
        self.store = store
        self.shard_id = int(shard_id)
        # issued by the server at the first call unless given (claim()), so host clocks never order lives
        self._incarnation = int(incarnation) if incarnation is not None else None
        self.resume: bool | frozenset[str] = resume if isinstance(resume, bool) else frozenset(resume)
        self.seq = 0
        self.known: codec.PullResult | None = None
        self._polled: codec.PullResult | None = None  # the state a poll's expected reply was made for
        self._poll_reply: list[bytes] = []
        self.highest_version = 0  # the highest fleet version this client has seen, in any epoch
        self._continued_epoch: int | None = None  # epoch_tag of highest_version when continued from another process
        # called with each seq before its fold is sent (a sidecar records it for its successor)
        self.reserve = reserve
        self.take_over = True  # claim even while another live process holds the shard (a Syncer asks first)
        self._limits: Limits | None = None
        self._fold_keys: dict[tuple[str, ...], list[str]] = {}  # KEYS of the fold, per set of reported keys
        self._resume_flags: dict[tuple[str, ...], tuple[Any, str]] = {}  # (resume, its flags), per set of keys
        self._lock = threading.RLock()

    @property
    def incarnation(self) -> int:
        """This process' incarnation of the shard, claimed from the server on first use."""
        if self._incarnation is None:
            with self._lock:
                if self._incarnation is None:
                    self._incarnation = self.store.claim(self.shard_id, self.take_over)
        return self._incarnation

    @incarnation.setter
    def incarnation(self, value: int) -> None:
        """This process's incarnation of the shard, claimed from the server on first use."""
        self._incarnation = int(value)

    @property
    def claimed(self) -> bool:
        """Whether this process has claimed its incarnation yet (reading `incarnation` claims one)."""
        return self._incarnation is not None

    @property
    def claimed_incarnation(self) -> int | None:
        """The incarnation if claimed, else None (reading it never claims one)."""
        return self._incarnation

    def continue_from(self, epoch_tag: int, version: int) -> None:
        """Carry on from another process serving this shard (a restarted sidecar): the newest fleet
        state it handed over was ``version`` of the epoch with ``epoch_tag``
        (`redisync.store.codec.epoch_tag`), so an older state of that epoch is lost writes here too."""
        self.highest_version = max(self.highest_version, version)
        self._continued_epoch = epoch_tag

    def resumes(self, name: str) -> bool:
        """Whether this incarnation takes over its previous life's slot of ``key``."""
        return self.resume if isinstance(self.resume, bool) else name in self.resume

    def last_folded_seq(self) -> int:
        """The last sequence number the server folded for this incarnation (0 if none): where a new
        process serving the same incarnation (a restarted sidecar) continues."""
        seq: int = self.store.last_folded_seq(self.shard_id, self.incarnation)
        return seq

    def publish(self, reports: Mapping[str, Any]) -> codec.PublishResult:
        """Validate, then fold this shard's reports in one FCALL, all or nothing.

        Args:
            reports: ``{key: report}``: a merge key's ``{"count": ..., "sum": ...[, "sumsq": ...]}``
                (this shard's cumulative own values), a broadcast or maximum key's ``{"value": ...}``;
                numbers as Python scalars, numpy arrays or tensors.

        Returns:
            The fold's outcome: ``applied`` with the new fleet version, or ``duplicate`` for a retry.

        Raises:
            RedisyncError: a typed subclass naming the key and what is wrong (a bad shape, a value
                that is not finite, a writer that is not the owner, a stale incarnation, ...).
        """
        store = self.store
        if self._limits is None:
            self._limits = store.limits()
        payloads = encode_reports(store.schema, reports, self._limits, self.shard_id)
        with self._lock:
            self.seq += 1
            if self.reserve is not None:
                self.reserve(self.seq)
            return self.publish_payloads(payloads, self.seq)

    def publish_payloads(self, payloads: Mapping[str, bytes], seq: int) -> codec.PublishResult:
        """Fold already-encoded payloads with an explicit ``seq`` (no client-side checks)."""
        store = self.store
        names = tuple(payloads)
        keys = self._fold_keys.get(names)
        if keys is None:
            keys = [store.keys.meta, store.keys.shards, store.keys.reports, store.keys.dead_letters]
            for name in names:
                keys += [store.keys.key_meta(name), store.keys.key_data(name)]
            self._fold_keys[names] = keys
        flags = self._resume_flags.get(names)
        if flags is None or flags[0] is not self.resume:  # (a Syncer may set resume after a restore)
            flags = self._resume_flags[names] = (self.resume, "".join("1" if self.resumes(n) else "0" for n in names))
        with self._lock:
            digest = store.schema.digest
            args: list[Any] = [digest, self.shard_id, self.incarnation, seq, self.highest_version, flags[1]]
            for name, payload in payloads.items():
                args += [name, payload]
            result, acked = store.fold(keys, args, names)
            self.highest_version = max(self.highest_version, result.fleet_version)
        if result.applied and acked < store.wait_replicas:
            raise errors.NotReplicated(
                f"{store.url}: fold {result.fleet_version} reached {acked} of {store.wait_replicas} replicas "
                f"within {store.wait_timeout_ms} ms; publish again"
            )
        return result

    def pull(self, check_first: bool = True) -> codec.PullResult | None:
        """The keys that changed since this shard's last pull, or None. One round trip when nothing
        changed (a plain read of the version), two when something did; ``check_first=False`` (the
        caller knows it changed: an announcement) makes that one.

        ``self.known`` keeps the whole fleet state as last seen (every key, latest version).
        """
        known = self.known
        if check_first and known is not None:  # (no lock: a poll that finds nothing costs one read, about a PING)
            if known is not self._polled:
                self._polled, self._poll_reply = known, codec.version_reply(known)
            if self.store._version() == self._poll_reply:
                return None
        with self._lock:
            result = self.store.pull(self.shard_id, self.known, self.incarnation, self.resumes)
            if result is not None:
                continued = self._continued_epoch
                same_epoch = not result.epoch_changed or (
                    self.known is None and continued is not None and codec.epoch_tag(result.epoch) == continued
                )
                self._continued_epoch = None
                if same_epoch and result.fleet_version < self.highest_version:
                    # same epoch, older version: the store lost its last writes (a crash between fsyncs)
                    result = dataclasses.replace(result, lost_writes=True)
                self.highest_version = max(self.highest_version, result.fleet_version)
                known = result
                if self.known is not None and not result.epoch_changed:
                    known = codec.PullResult(
                        result.epoch,
                        result.fleet_version,
                        False,
                        {**self.known.keys, **result.keys},
                        result.server_time_us,
                    )
                self.known = known
            return result
