"""The fold in pure Python: the oracle for ``lua/fold.lua``.

Everything the fold script does to a run's state is written here once more, in the same order and
with the same float64 arithmetic, so that tests can require the Lua fold (on a real Redis and on
fakeredis) to end in the same state as this reference after any sequence of reports. The envelope
(incarnations, sequence numbers, sizes, leases, restores, and who has left a key with a slot per
shard: `departed`) is here; what a report does to a key is its semantics' ``fold`` (`redisync.store.semantics`). Payloads are flat float64 vectors laid out as the key's
parts (`payload_parts`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Literal

from redisync.store.schema import Limits, Schema
from redisync.store.semantics.base import Fold, KeyState, Vector, departed

Status = Literal["applied", "duplicate", "rejected"]


@dataclass(frozen=True)
class Outcome:
    """The reference fold's result: status, fleet version and the keys' versions."""

    status: Status
    fleet_version: int = 0
    reason: str | None = None
    key: str | None = None


@dataclass
class ShardState:
    """The reference's record of a shard: incarnation, sequence and when it last reported."""

    incarnation: int
    seq: int
    at_us: int


class ReferenceFold:
    """The state of one run, folded exactly as ``lua/fold.lua`` folds it."""

    def __init__(self, schema: Schema, limits: Limits | None = None):
        self.schema = schema
        self.limits = limits or Limits()
        self.fleet_version = 0
        self.keys = {name: spec.new_state() for name, spec in schema.keys.items()}
        self.specs = dict(schema.keys)
        self.shards: dict[int, ShardState] = {}
        self.claimed: dict[int, int] = {}
        self.leases: dict[int, int] = {}  # per shard id: when its lease runs out (server µs: claims)
        self.alive: dict[int, int] = {}  # per shard id: when its lease runs out in the served clock (-1: given up)
        self.ended: dict[int, int] = {}  # per shard id that gave its lease up: when, in the served clock
        self.clock_wall: int | None = None  # the server's time at the run's last call (µs)
        self.clock_stalled = 0  # the time the server did not serve the run (µs), as lua/clock.lua keeps it

    def _stalled_at(self, now_us: int) -> int:
        if self.clock_wall is None:
            return self.clock_stalled
        gap = now_us - self.clock_wall
        if gap > self.limits.stall_after_us:
            return self.clock_stalled + gap - self.limits.stall_after_us
        return self.clock_stalled + gap if gap < 0 else self.clock_stalled

    def served_at(self, now_us: int) -> int:
        """The run's served clock at a call at the server's time ``now_us``: that time less what the
        server did not serve (a gap past ``stall_after_s``, a clock step back)."""
        return now_us - self._stalled_at(now_us)

    def _tick(self, now_us: int) -> int:
        self.clock_stalled, self.clock_wall = self._stalled_at(now_us), now_us
        return now_us - self.clock_stalled

    def lease(self, shard_id: int, incarnation: int, now_us: int, lease_ms: int) -> bool:
        """Renew a lease for ``lease_ms`` (0: give it up), as ``lua/lease.lua`` does: refused when a
        later life holds the shard."""
        cur = self.shards.get(shard_id)
        if cur is not None and cur.incarnation != incarnation:
            return False
        served = self._tick(now_us)
        self.leases[shard_id] = now_us + 1000 * lease_ms
        self.alive[shard_id] = served + 1000 * lease_ms if lease_ms > 0 else -1
        if lease_ms <= 0:
            self.ended[shard_id] = served
        return True

    def claim(self, shard_id: int, now_us: int) -> int:
        """A new incarnation, as ``lua/claim.lua`` issues it: the server's time, or one above the
        shard's current and last claimed incarnation; it becomes the shard's current one at once."""
        cur = self.shards.get(shard_id)
        new = max(now_us, (cur.incarnation + 1) if cur else 0, self.claimed.get(shard_id, 0) + 1)
        self.shards[shard_id] = ShardState(new, 0, cur.at_us if cur else 0)
        self.claimed[shard_id] = new
        return new

    def restore(self, snap: ReferenceFold) -> None:
        """Replace the state by ``snap``'s, as ``lua/restore.lua`` does: versions above both, and the
        shards this run knows keep their current incarnation (its live collectors keep publishing)."""
        self.fleet_version = max(self.fleet_version, snap.fleet_version) + 1
        for name, key in snap.keys.items():
            mine = self.keys[name]
            self.keys[name] = copy.deepcopy(key)
            self.keys[name].version = max(mine.version, key.version) + 1
        # the ids this run knows (any entry in its shards hash) keep every entry of theirs
        known = set(self.shards) | set(self.claimed) | set(self.leases) | set(self.alive)
        self.shards = {**{i: copy.deepcopy(v) for i, v in snap.shards.items() if i not in known}, **self.shards}
        self.claimed = {**{i: v for i, v in snap.claimed.items() if i not in known}, **self.claimed}
        self.leases = {**{i: v for i, v in snap.leases.items() if i not in known}, **self.leases}
        self.alive = {**{i: v for i, v in snap.alive.items() if i not in known}, **self.alive}
        self.ended = {**{i: v for i, v in snap.ended.items() if i not in known}, **self.ended}
        if self.clock_wall is None:  # the run's served clock stays the run's
            self.clock_wall, self.clock_stalled = snap.clock_wall, snap.clock_stalled

    def apply(
        self,
        shard_id: int,
        incarnation: int,
        seq: int,
        payloads: Mapping[str, Vector],
        now_us: int,
        floor: int = 0,
        resume: Set[str] = frozenset(),
    ) -> Outcome:
        """Fold one report; ``floor`` is the highest fleet version the client has seen (the new
        version is above it); ``resume`` names the keys this incarnation resumed from a checkpoint."""
        cur = self.shards.get(shard_id)
        if cur is not None:
            if incarnation < cur.incarnation:
                return Outcome("rejected", reason="stale_incarnation")
            if incarnation == cur.incarnation:
                if seq == cur.seq:
                    return Outcome("duplicate", self.fleet_version)
                if seq < cur.seq:
                    return Outcome("rejected", reason="seq_rollback")
        if sum(8 * p.size for p in payloads.values()) > self.limits.max_report_bytes:
            return Outcome("rejected", reason="too_large")
        folded: dict[str, KeyState] = {}
        served = self.served_at(now_us)
        for name, payload in payloads.items():
            state, spec = self.keys.get(name), self.specs.get(name)
            if state is None or spec is None:
                return Outcome("rejected", reason="unknown_key", key=name)
            if payload.shape != (spec.width,):
                return Outcome("rejected", reason="shape", key=name)
            report = Fold(shard_id, incarnation, seq, payload, now_us, name in resume, self.alive, served, self.ended)
            if spec.slots:  # (a key with a slot per shard: who has left, judged first, as lua/lifecycle.lua does)
                written = {other: slot.at_us for other, slot in state.slots.items()}
                gone = departed(written, report, spec.lifecycle, spec.stale_after_s, spec.grace_s)
                report = dataclasses.replace(report, gone=gone)
            result = spec.fold(state, report)
            if isinstance(result, str):
                return Outcome("rejected", reason=result, key=name)
            folded[name] = result
        self.keys.update(folded)
        self.fleet_version = max(self.fleet_version, floor) + 1
        self.shards[shard_id] = ShardState(incarnation, seq, now_us)
        # only a fold of a key with a lease grace reads (and advances) the run's clock; a shard folding such a
        # key after its lease ran out (or was given up) lived on: until a grace past this fold
        if any(self.specs[name].register_fields().get("lease_grace_s") for name in payloads):  # as declared
            self._tick(now_us)
            if shard_id in self.alive and self.alive[shard_id] < served:
                self.alive[shard_id] = served
        return Outcome("applied", self.fleet_version)
