"""One sub-run's aggregator: it makes a run split over several primaries one fleet.

A split run (`Store.split`) keeps no collector of its own: shard ``k`` publishes to sub-run
``k % m``, each sub-run in its own Cluster slot (`redisync.aggregation.layout` places them on
different primaries). The aggregator of sub-run ``j`` does, every ``period_s``:

1. **up**: pull the sub-run and publish what its collectors hold (the fleet without the aggregator's
   own slot) as one shard of the root run, shard ``ROOT_SHARD_BASE + j``;
2. **down**: pull the root and write what the *other* sub-runs hold (the root without sub-run ``j``'s
   shard) back into the sub-run, as its shard ``OUTSIDE_SHARD``.

A collector then pulls one place, its sub-run, and finds the whole fleet there: its own sub-run's
slots as folded, the rest as of the last round (staleness: one period and one fold). Exact: a merge
key's contribution is its exact sum less the aggregator's own slots, read at one instant from the
stored planes and forwarded as exact pieces (`exact_pieces`: two slots almost always, more beyond
2^1000), so the root and every sub-run hold the unsplit run's value bit for bit; a maximum's or a
minimum's value is forwarded as it is; a key with an owner has the owner's value forwarded, up from
the owner's sub-run as the owner, down into the others as the owner. Both shards resume their slots (``resume``), so a restarted aggregator takes
its previous slots over and nothing is counted twice. A sub-run lost by its store (a failover onto
an empty node) is re-seeded by its collectors' next reports; meanwhile the aggregator keeps
publishing the sub-run's last whole contribution, so the root does not dip, until as many shards
have claimed the new sub-run as before or ``reseed_s`` has passed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import errors
from ..store.client import ShardClient, Store
from ..store.codec import PullResult
from ..store.schema import DEFAULT_LEASE_S, Limits, MergeSpec, Schema
from ..store.semantics.base import Vector, vector
from ..store.semantics.merge import exact_pieces, planes_of

OUTSIDE_SHARD = 999_999_999  # in a sub-run: the rest of the root run, written back by the aggregator
ROOT_SHARD_BASE = 999_999_000  # in the root: sub-run j's collectors, published as shard ROOT_SHARD_BASE + j
PIECE_STRIDE = 1_000  # a contribution's piece p > 0 is published as that shard id less p × PIECE_STRIDE
MAX_PIECES = 32  # the most pieces of one contribution: a merge sum up to 31 × 2^1000
log = logging.getLogger("redisync.aggregation")


@dataclass
class Round:
    """What one round did: the keys published up into the root and written down into the sub-run."""

    up: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    held: bool = False  # the sub-run is being re-seeded: its last whole contribution was kept


class Aggregator:
    """Sub-run ``index`` of the split run ``root``, folded into the root and the root written back.

    Args:
        root: the split run's store (`Store.split` made its sub-runs).
        index: which sub-run (0 ... m - 1).
        period_s: one round every this many seconds (the staleness it adds, with one fold).
        lease_s: the lease of its two shards (a dead aggregator's slots leave state keys after it).
        heartbeat_s: a slot is re-published at least this often, changed or not (``stale_after_s``).
        reseed_s: the longest a re-seeding sub-run's last contribution is kept.
    """

    def __init__(
        self,
        root: Store,
        index: int,
        *,
        period_s: float = 0.5,
        lease_s: float = DEFAULT_LEASE_S,
        heartbeat_s: float = 1.0,
        reseed_s: float = 10.0,
    ):
        names = root.subruns()
        if not names:
            raise errors.ConfigurationError(f"run {root.run!r} is not split: nothing to aggregate (Store.split)")
        if not 0 <= index < len(names):
            raise errors.ConfigurationError(f"run {root.run!r} has {len(names)} sub-runs; there is no sub-run {index}")
        self.root, self.sub, self.index, self.names = root, root.sibling(names[index]), index, names
        self.period_s, self.lease_s, self.heartbeat_s, self.reseed_s = period_s, lease_s, heartbeat_s, reseed_s
        # its two shards, resumed (a restart takes its predecessor's slots over) but never taken from a
        # live holder: a second aggregator of the same sub-run is refused (ShardInUse), not let in
        self.up = self._claimed(root.shard(ROOT_SHARD_BASE + index, resume=True))
        self.down = self._claimed(self.sub.shard(OUTSIDE_SHARD, resume=True))
        self.schema: Schema | None = None
        self.limits: Limits | None = None  # the sub-run's, for a sub-run or root registered again
        self._owners: dict[int, ShardClient] = {}  # an owner's shard, in the root or the sub-run
        self._sent: dict[tuple[int, str], tuple[bytes, float]] = {}  # (shard, key) -> payload, when sent
        self._pieces: dict[int, list[ShardClient]] = {self.up.shard_id: [self.up], self.down.shard_id: [self.down]}
        self._pieces_found = False  # (a predecessor's extra pieces, taken over at the first round)
        self._last_up: dict[str, Vector] = {}  # the last whole contribution (merge keys: its pieces' rows)
        self._held: dict[str, Vector] | None = None  # the contribution kept while the sub-run re-seeds
        self._held_until = 0.0
        self._shards_before = 0
        self._epoch: str | None = None
        self._root_epoch: str | None = None
        self._leased_at = -float("inf")
        self.rounds = 0

    # ------------------------------------------------------------------ one round

    def step(self) -> Round:
        """One round: up, then down. Raises what the store raises (`ConnectionUnavailable`, ...)."""
        done = Round()
        schema = self._schema()
        self.root.split(self.names)  # (a root the store lost is split again before anything is published)
        if not self.root.registered():  # and registered again, by whichever round finds it lost
            self.root.register(schema, self.limits)
            self._forget_sent(self.root)
            log.warning("root run %r lost by its store: registered again by sub-run %r's aggregator", self.root.run,
                        self.sub.run)  # fmt: skip
        self._hold(self.up)  # (each claimed and leased at once: two aggregators started together leave one)
        self._hold(self.down)
        self._find_pieces()
        sub = self._pull(self.down, self.sub, schema)
        self._renew_leases()
        up = self._contribution(sub, schema, done)
        self._publish_up(up, schema, done)
        root = self._pull(self.up, self.root, schema)
        if self._root_epoch is not None and root.epoch != self._root_epoch:  # registered again since our last round
            self._forget_sent(self.root)
            self._publish_up(up, schema, done)
            root = self._pull(self.up, self.root, schema)
        self._root_epoch = root.epoch
        down: dict[str, Vector] = {}
        for name, view in root.keys.items():
            owner = self._owner(schema, name)
            if owner is not None:
                if self._home(owner) != self.index and view.value is not None:
                    self._send(self.sub, self._owner_client(self.sub, owner), {name: view.value}, done.down)
                continue
            rest = self._rest(self.root, schema, name, self.up, view)
            if rest is not None:
                down[name] = rest
        self._send_pieces(self.sub, self.down, down, done.down)
        self.rounds += 1
        return done

    def _rest(self, store: Store, schema: Schema, name: str, own: ShardClient, view: Any) -> Vector | None:
        """A key of ``store``'s run less what ``own``'s pieces hold there: a merge key's as exact pieces
        (``[K, width]``: its stored planes and those slots read at one instant), another's as pulled."""
        spec = schema.keys[name]
        if view.value is None:
            return None
        if not isinstance(spec, MergeSpec) or self._owned(schema, name):
            others: Vector | None = view.others()
            return others
        ids = [client.shard_id for client in self._pieces[own.shard_id]]
        raw = store.key_fields(name, ["agg", "agg_lo", *(f"slot:{i}" for i in ids)])
        if raw[0] is None:
            return None
        rows = list(planes_of(raw[0], raw[1], spec.width)) + [-vector(r) for r in raw[2:] if r is not None]
        nonneg = np.ones(spec.width, dtype=bool)
        nonneg[spec.count_size : spec.count_size + spec.size] = False  # (the sum part is signed)
        return exact_pieces(rows, spec.width, nonneg.tolist())

    def _send_pieces(self, store: Store, first: ShardClient, values: dict[str, Vector], sent: list[str]) -> None:
        """Publish ``values`` through ``first``'s pieces: a merge key's ``[K, width]`` rows one a piece
        (the pieces it no longer needs zeroed), another key's value through ``first`` alone."""
        pieces = self._pieces[first.shard_id]
        needed = max([len(v) for v in values.values() if v.ndim == 2] + [1])
        if needed > MAX_PIECES:
            name = max(values, key=lambda n: len(values[n]) if values[n].ndim == 2 else 0)
            raise errors.NonFiniteValue(
                name, f"sub-run {self.sub.run!r}: its sum needs {needed} slots of at most 2^1000, beyond {MAX_PIECES}"
            )
        while len(pieces) < needed:
            client = self._claimed(store.shard(first.shard_id - PIECE_STRIDE * len(pieces), resume=True))
            self._hold(client)
            pieces.append(client)
        for p, client in enumerate(pieces):
            out: dict[str, Vector] = {}
            for name, value in values.items():
                if value.ndim == 2:
                    out[name] = value[p] if p < len(value) else np.zeros(value.shape[1])
                elif p == 0:
                    out[name] = value
            self._send(store, client, out, sent if p == 0 else [])

    def _find_pieces(self) -> None:
        """Once: a predecessor's extra pieces (shards it claimed beyond the first of each side) taken
        over, so that a slot it left is zeroed rather than counted twice."""
        if self._pieces_found:
            return
        for store, first in ((self.root, self.up), (self.sub, self.down)):
            ids = store.shard_ids()
            pieces = self._pieces[first.shard_id]
            while first.shard_id - PIECE_STRIDE * len(pieces) in ids and len(pieces) < MAX_PIECES:
                client = self._claimed(store.shard(first.shard_id - PIECE_STRIDE * len(pieces), resume=True))
                self._hold(client)
                pieces.append(client)
        self._pieces_found = True

    def _publish_up(self, up: dict[str, Vector], schema: Schema, done: Round) -> None:
        """The sub-run's contribution into the root: as its shard's pieces, and each owner's key as its owner."""
        self._send_pieces(self.root, self.up, {n: v for n, v in up.items() if not self._owned(schema, n)}, done.up)
        for name, value in up.items():
            owner = self._owner(schema, name)
            if owner is not None and self._home(owner) == self.index:
                self._send(self.root, self._owner_client(self.root, owner), {name: value}, done.up)

    def _schema(self) -> Schema:
        """The collectors' schema, registered in the sub-run (and then in the root) by the first of them."""
        if self.schema is None:
            try:
                schema, limits = self.sub.schema, self.sub.limits()
            except errors.RunNotFound:
                schema, limits = self.root.schema, self.root.limits()  # a sub-run lost by its store: the root says
            self.root.split(self.names)  # (a root the store lost: split again before it is registered)
            self.root.register(schema, limits)
            self.schema, self.limits = schema, limits
        return self.schema

    def _pull(self, shard: ShardClient, store: Store, schema: Schema) -> PullResult:
        """The whole state of ``store``'s run as ``shard`` sees it (registered again if the store lost it)."""
        try:
            shard.pull(check_first=True)
        except errors.RunNotFound:
            store.register(schema, self.limits)
            shard.known = None
            shard.pull(check_first=False)
        assert shard.known is not None
        return shard.known

    def _contribution(self, sub: PullResult, schema: Schema, done: Round) -> dict[str, Vector]:
        """What the sub-run's collectors hold, per key; the last whole one while the sub-run re-seeds."""
        now = time.monotonic()
        shards = self._shard_count()
        if self._epoch is not None and sub.epoch != self._epoch:
            self._held, self._held_until = dict(self._last_up), now + self.reseed_s
            self._forget_sent(self.sub)  # the rest of the fleet is written into the new sub-run at once
            log.warning("sub-run %r lost by its store: its last contribution is kept while it re-seeds", self.sub.run)
        self._epoch = sub.epoch
        if self._held is not None:
            if shards < self._shards_before and now < self._held_until:
                done.held = True
                return self._held
            self._held = None
        self._shards_before = shards
        out = {}
        for name, view in sub.keys.items():
            rest = self._rest(self.sub, schema, name, self.down, view)
            if rest is not None:
                out[name] = rest
        self._last_up = out
        return out

    def _shard_count(self) -> int:
        """How many collectors have claimed a shard in the sub-run (the aggregator's own not counted)."""
        ids = self.sub.shard_ids()
        own = {client.shard_id for client in self._pieces[self.down.shard_id]}
        return len(ids - {OUTSIDE_SHARD, *own, *self._owners_written_down()})

    def _owners_written_down(self) -> set[int]:
        return {o for o in self._owners if self._home(o) != self.index}

    def _send(self, store: Store, shard: ShardClient, values: dict[str, Vector], sent: list[str]) -> None:
        """Publish the keys of ``values`` that changed, or whose slot is due a heartbeat, in one fold."""
        schema, now = self.schema, time.monotonic()
        assert schema is not None
        reports = {}
        for name, flat in values.items():
            payload = np.ascontiguousarray(flat, dtype="<f8").tobytes()
            last = self._sent.get((shard.shard_id, name))
            if last is not None and last[0] == payload and now - last[1] < self.heartbeat_s:
                continue
            parts = schema.keys[name].parts_of(np.frombuffer(payload, dtype="<f8"))
            if "count" in parts:  # a difference of sums may round below zero where nothing is left
                parts["count"] = np.maximum(parts["count"], 0.0)
            reports[name] = parts
        if not reports:
            return
        shard.publish(reports)
        for name in reports:
            self._sent[(shard.shard_id, name)] = (np.ascontiguousarray(values[name], dtype="<f8").tobytes(), now)
        sent.extend(reports)

    def _forget_sent(self, store: Store) -> None:
        """What was sent to ``store``'s run, forgotten: a run its store lost is sent everything again."""
        first = self.up if store is self.root else self.down
        ids = {client.shard_id for client in self._pieces[first.shard_id]}
        ids |= {o for o, client in self._owners.items() if client.store is store}
        self._sent = {k: v for k, v in self._sent.items() if k[0] not in ids}
        self._leased_at = -float("inf")

    @staticmethod
    def _claimed(client: ShardClient) -> ShardClient:
        client.take_over = False
        return client

    def _hold(self, client: ShardClient) -> None:
        """Claim ``client``'s shard (refused while another holder's lease is fresh: `ShardInUse`) and
        lease it in the same breath. Claims leased only after all of them let two aggregators started
        together each take one of the other's shards, and both were then fenced out."""
        if client.claimed:
            return
        incarnation = client.incarnation  # (the claim)
        if not client.store.lease(client.shard_id, incarnation, max(1, int(self.lease_s * 1e3))):
            raise errors.Fenced(
                f"sub-run {self.sub.run!r}: another aggregator claimed shard {client.shard_id} of run "
                f"{client.store.run!r} as this one did; this one stops (two aggregators of one sub-run)"
            )

    def _renew_leases(self) -> None:
        if time.monotonic() - self._leased_at < self.lease_s / 5:
            return
        ms = max(1, int(self.lease_s * 1e3))
        for client in (*self._all_pieces(), *self._owners.values()):
            if not client.store.lease(client.shard_id, client.incarnation, ms):
                raise errors.Fenced(
                    f"sub-run {self.sub.run!r}: another aggregator has claimed shard {client.shard_id} of run "
                    f"{client.store.run!r}; this one stops (two aggregators of one sub-run)"
                )
        self._leased_at = time.monotonic()

    def _all_pieces(self) -> list[ShardClient]:
        return [client for pieces in self._pieces.values() for client in pieces]

    def release(self) -> None:
        """Give its shards' leases up (a clean stop): a successor claims them at once."""
        for client in (*self._all_pieces(), *self._owners.values()):
            if client.claimed:
                client.store.lease(client.shard_id, client.incarnation, 0)

    # ------------------------------------------------------------------ keys with an owner

    def _home(self, shard_id: int) -> int:
        return shard_id % len(self.names)

    @staticmethod
    def _owner(schema: Schema, name: str) -> int | None:
        owner: int | None = getattr(schema.keys[name], "owner", None)
        return owner

    def _owned(self, schema: Schema, name: str) -> bool:
        return self._owner(schema, name) is not None

    def _owner_client(self, store: Store, owner: int) -> ShardClient:
        client = self._owners.get(owner)
        if client is None:
            client = self._owners[owner] = self._claimed(store.shard(owner, resume=True))
        self._hold(client)
        return client

    # ------------------------------------------------------------------ the loop

    def run(self, stop: threading.Event, on_round: Callable[[Round], Any] | None = None) -> None:
        """Rounds every ``period_s`` until ``stop`` is set, then its leases given up; a store that
        cannot be reached, or refuses a round (a schema registered anew, a role without a command), is
        tried again next period (said in the log once per change). A sub-run whose shards a holder's
        lease still covers at the start (a crashed predecessor's, restarted at once by a supervisor) is
        waited for, once, as long as that lease has left, saying so; raises `ShardInUse` when the holder
        is still there after that (a live aggregator of the sub-run), and `Fenced` when another has
        claimed its shards since."""
        said: str | None = None
        try:
            self._rounds(stop, on_round, said)
        finally:
            with contextlib.suppress(errors.RedisyncError):
                self.release()

    def _rounds(self, stop: threading.Event, on_round: Callable[[Round], Any] | None, said: str | None) -> None:
        waited: set[tuple[int, str]] = set()  # (shard, holder) whose lease was waited for once
        while not stop.is_set():
            began = time.monotonic()
            try:
                done = self.step()
                if said is not None:
                    log.info("sub-run %r: the store answers again", self.sub.run)
                said = None
                if on_round is not None:
                    on_round(done)
            except errors.ShardInUse as e:
                if self.rounds > 0 or (e.shard_id, e.incarnation) in waited:  # its holder renewed: a live one
                    log.error("sub-run %r: %s", self.sub.run, e)
                    raise
                waited.add((e.shard_id, e.incarnation))
                log.warning(
                    "sub-run %r: shard %d is held (incarnation %s) for %d ms more: waiting for that lease to run "
                    "out (a crashed predecessor's); refused after it if its holder is alive",
                    self.sub.run, e.shard_id, e.incarnation, e.remaining_ms,
                )  # fmt: skip
                stop.wait(e.remaining_ms / 1e3 + 0.1)
                continue
            except (errors.Fenced, errors.StaleIncarnation) as e:
                log.error("sub-run %r: %s", self.sub.run, e)
                raise errors.Fenced(str(e)) if isinstance(e, errors.StaleIncarnation) else e from None
            except errors.RedisyncError as e:
                if f"{type(e).__name__}: {e}" != said:
                    log.warning(
                        "sub-run %r: %s: %s (tried again every %g s)", self.sub.run, type(e).__name__, e, self.period_s
                    )
                said = f"{type(e).__name__}: {e}"
            stop.wait(max(0.0, self.period_s - (time.monotonic() - began)))
