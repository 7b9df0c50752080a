"""The fold in pure Python: the specification of the two semantics and the oracle for the Lua.

Everything the fold script does to a run's state is written here once more, in the same
order and with the same float64 arithmetic, so that tests can require the Lua fold (on a
real Redis and on fakeredis) to end in the same state as this reference after any sequence
of reports. Payloads are flat float64 vectors: a broadcast value, or a merge key's
``count ‖ sum [‖ sumsq]`` parts laid end to end.

The merge aggregate is recomputed at every fold as the sum of the retired history and the live
slots, in two levels of stored sums: the slots summed per sub-group of 4 consecutive shard ids
(ascending), the sub-group sums per group of 4 sub-groups (16 shard ids, ascending), then the retired
history and the group sums (ascending groups). A fold re-sums its own sub-group's slots (and any that
lost a stale slot) and their groups' sub-group sums; every other sum is stored. Its error is therefore
bounded by the live values alone: each live value passes through at most 3 + 3 + G additions for G
groups (and the history), so ``|agg − Σ live| ≤ (6 + G)·2⁻⁵³·Σ|live|`` to first order — far inside
``1e-12·Σ|live|`` — however large the values that once passed through a slot. A fold that would make an aggregate or its
moments non-finite is refused.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import AbstractSet, Literal, Mapping

import numpy as np

from .schema import BroadcastSpec, Limits, MergeSpec, Schema

Status = Literal["applied", "duplicate", "rejected"]


@dataclass(frozen=True)
class Outcome:
    status: Status
    fleet_version: int = 0
    reason: str | None = None
    key: str | None = None


@dataclass
class Slot:
    incarnation: int
    seq: int
    at_us: int
    payload: np.ndarray


@dataclass
class KeyState:
    spec: BroadcastSpec | MergeSpec
    version: int = 0
    # broadcast: the value and its writer; merge: the aggregate, live slots and retired history
    value: np.ndarray | None = None
    writer: int | None = None
    slots: dict[int, Slot] = field(default_factory=dict)
    retired: np.ndarray | None = None

    def __post_init__(self) -> None:
        if isinstance(self.spec, MergeSpec):
            self.value = np.zeros(self.spec.width)


@dataclass
class ShardState:
    incarnation: int
    seq: int
    at_us: int


def check_values(spec: BroadcastSpec | MergeSpec, payload: np.ndarray) -> str | None:
    """The rejection reason for a payload's values, checked element by element in payload order."""
    if isinstance(spec, BroadcastSpec):
        return None if np.isfinite(payload).all() else "non_finite"
    signed = range(spec.count_size, spec.count_size + spec.size)  # the sum part
    for i, v in enumerate(payload):
        if not np.isfinite(v):
            return "non_finite"
        if v < 0 and i not in signed:
            return "negative"
    return None


def summed(vectors: list[np.ndarray], width: int) -> np.ndarray:
    """``0 + v₁ + v₂ + …`` in the given order: the fold script's summation, bit for bit."""
    out = np.zeros(width)
    for v in vectors:
        out = out + v
    return out


SUB = 4  # shard ids per sub-group (stored as ``sub:<id // SUB>``)
SUBS = 4  # sub-groups per group (stored as ``group:<id // (SUB * SUBS)>``)
# the fold's ``sums_layout`` (sub-groups of 4 ids, groups of 16, a lone sum not stored): a key whose
# sums were laid out otherwise has them all re-made
LAYOUT = "4/16/lone"


def layered_sums(payloads: Mapping[int, np.ndarray], width: int) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """``({q: sum}, {g: sum})``: each sub-group's sum of its slots' payloads in ascending shard order,
    each group's sum of its sub-groups' sums in ascending order, both in ascending order: what the
    fold stores as ``sub:<q>`` and ``group:<g>``."""
    members: dict[int, list[np.ndarray]] = {}
    for shard in sorted(payloads):
        members.setdefault(shard // SUB, []).append(payloads[shard])
    subs = {q: summed(members[q], width) for q in sorted(members)}
    parts: dict[int, list[np.ndarray]] = {}
    for q, sub in subs.items():
        parts.setdefault(q // SUBS, []).append(sub)
    return subs, {g: summed(parts[g], width) for g in sorted(parts)}


def stored_sums(payloads: Mapping[int, np.ndarray], width: int, retired: bool) -> dict[str, np.ndarray]:
    """The sums the fold stores, by field: ``sub:<q>`` of a group of two sub-groups or more, and
    ``group:<g>`` of an aggregate of two terms or more (groups, and the retired history). A lone sum
    equals the sum it is the only part of (0 + x is x), so it is not stored; a fold that finds one
    missing re-makes it from its parts."""
    subs, groups = layered_sums(payloads, width)
    per_group: dict[int, int] = {}
    for q in subs:
        per_group[q // SUBS] = per_group.get(q // SUBS, 0) + 1
    out = {f"sub:{q}": v for q, v in subs.items() if per_group[q // SUBS] > 1}
    if len(groups) + int(retired) > 1:
        out |= {f"group:{g}": v for g, v in groups.items()}
    return out


def group_sums(slots: Mapping[int, "Slot"], width: int) -> list[np.ndarray]:
    """The group sums of live slots, in ascending group order, as the fold sums them into the aggregate."""
    return list(layered_sums({shard: slot.payload for shard, slot in slots.items()}, width)[1].values())


def finite_moments(spec: MergeSpec, flat: np.ndarray) -> bool:
    """Whether a merge vector and the moments a reader takes of it (mean, mean², sumsq/count) are finite."""
    if not np.isfinite(flat).all():
        return False
    parts = split_parts(spec, flat)
    count = np.broadcast_to(parts["count"], spec.shape)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        safe = np.where(count > 0, count, 1.0)
        mean = np.where(count > 0, parts["sum"] / safe, 0.0)
        ok = np.isfinite(mean)
        if spec.sumsq:
            ok &= np.isfinite(mean * mean) & np.isfinite(np.where(count > 0, parts["sumsq"] / safe, 0.0))
    return bool(ok.all())


class ReferenceFold:
    """The state of one run, folded exactly as ``lua/fold.lua`` folds it."""

    def __init__(self, schema: Schema, limits: Limits | None = None):
        self.schema = schema
        self.limits = limits or Limits()
        self.fleet_version = 0
        self.keys = {name: KeyState(spec) for name, spec in schema.keys.items()}
        self.shards: dict[int, ShardState] = {}
        self.claimed: dict[int, int] = {}
        self.leases: dict[int, int] = {}  # per shard id: when its lease runs out (server µs)

    def lease(self, shard_id: int, incarnation: int, until_us: int) -> bool:
        """Renew a lease, as ``lua/lease.lua`` does: refused when a later life holds the shard."""
        cur = self.shards.get(shard_id)
        if cur is not None and cur.incarnation != incarnation:
            return False
        self.leases[shard_id] = until_us
        return True

    def claim(self, shard_id: int, now_us: int) -> int:
        """A new incarnation, as ``lua/claim.lua`` issues it: the server's time, or one above the
        shard's current and last claimed incarnation; it becomes the shard's current one at once."""
        cur = self.shards.get(shard_id)
        new = max(now_us, (cur.incarnation + 1) if cur else 0, self.claimed.get(shard_id, 0) + 1)
        self.shards[shard_id] = ShardState(new, 0, cur.at_us if cur else 0)
        self.claimed[shard_id] = new
        return new

    def restore(self, snap: "ReferenceFold") -> None:
        """Replace the state by ``snap``'s, as ``lua/restore.lua`` does: versions above both, and the
        shards this run knows keep their current incarnation (its live collectors keep publishing)."""
        self.fleet_version = max(self.fleet_version, snap.fleet_version) + 1
        for name, key in snap.keys.items():
            mine = self.keys[name]
            self.keys[name] = copy.deepcopy(key)
            self.keys[name].version = max(mine.version, key.version) + 1
        # the ids this run knows (any entry in its shards hash) keep every entry of theirs
        known = set(self.shards) | set(self.claimed) | set(self.leases)
        self.shards = {**{i: copy.deepcopy(v) for i, v in snap.shards.items() if i not in known}, **self.shards}
        self.claimed = {**{i: v for i, v in snap.claimed.items() if i not in known}, **self.claimed}
        self.leases = {**{i: v for i, v in snap.leases.items() if i not in known}, **self.leases}

    def apply(
        self,
        shard_id: int,
        incarnation: int,
        seq: int,
        payloads: Mapping[str, np.ndarray],
        now_us: int,
        floor: int = 0,
        resume: AbstractSet[str] = frozenset(),
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
        folded: dict[str, tuple[np.ndarray, np.ndarray | None, dict[int, Slot]]] = {}
        for name, payload in payloads.items():
            state = self.keys.get(name)
            if state is None:
                return Outcome("rejected", reason="unknown_key", key=name)
            if payload.shape != (state.spec.width,):
                return Outcome("rejected", reason="shape", key=name)
            if isinstance(state.spec, BroadcastSpec) and state.spec.owner not in (None, shard_id):
                return Outcome("rejected", reason="not_owner", key=name)
            bad = check_values(state.spec, payload)
            if bad:
                return Outcome("rejected", reason=bad, key=name)
            if isinstance(state.spec, MergeSpec):
                result = self._fold_merge(
                    state, shard_id, incarnation, seq, payload, now_us, name in resume, self.leases
                )
                if result is None:
                    return Outcome("rejected", reason="non_finite", key=name)
                folded[name] = result

        for name, payload in payloads.items():
            state = self.keys[name]
            if isinstance(state.spec, BroadcastSpec):
                state.value = payload.copy()
                state.writer = shard_id
            else:
                state.value, state.retired, state.slots = folded[name]
            state.version += 1
        self.fleet_version = max(self.fleet_version, floor) + 1
        self.shards[shard_id] = ShardState(incarnation, seq, now_us)
        return Outcome("applied", self.fleet_version)

    @staticmethod
    def _fold_merge(
        state: KeyState,
        shard_id: int,
        incarnation: int,
        seq: int,
        payload: np.ndarray,
        now_us: int,
        resumed: bool,
        leases: Mapping[int, int],
    ) -> tuple[np.ndarray, np.ndarray | None, dict[int, Slot]] | None:
        """The key's new (aggregate, retired, slots), or None when they would not be finite."""
        spec = state.spec
        assert isinstance(spec, MergeSpec)
        retired = state.retired
        old = state.slots.get(shard_id)
        if old is not None and old.incarnation != incarnation and not resumed and spec.lifecycle == "history":
            # a fresh restart of a history key: the previous life's counts are kept as retired history
            # (a slot alone is a payload checked when it was folded; a sum of two may overflow)
            if retired is None:
                retired = old.payload.copy()
            else:
                retired = summed([retired, old.payload], spec.width)  # 0 + r + o, as the fold sums (−0.0 included)
                if not finite_moments(spec, retired):
                    return None
        slots = {}
        for other, slot in state.slots.items():
            # a state key's slot leaves once stale or its shard's lease lapsed; a history key keeps it (its
            # samples stay counted, as its shard's fresh restart would retire them: whichever fold comes first)
            stale = (
                spec.lifecycle == "state"
                and spec.stale_after_s is not None
                and now_us - slot.at_us > spec.stale_after_s * 1e6
            )
            grace = spec.lease_grace_s if spec.lifecycle == "state" else None
            # (unless written after its lease ran out: it lived on, whichever fold comes first)
            lapsed = (
                grace is not None
                and other in leases
                and now_us - leases[other] > grace * 1e6
                and slot.at_us <= leases[other]
            )
            if other != shard_id and not (stale or lapsed):
                slots[other] = slot
        slots[shard_id] = Slot(incarnation, seq, now_us, payload.copy())
        vectors = ([] if retired is None else [retired]) + group_sums(slots, spec.width)
        agg = summed(vectors, spec.width)
        if not finite_moments(spec, agg):
            return None
        return agg, retired, slots


# ------------------------------------------------------------------------- reading helpers


def split_parts(spec: MergeSpec, flat: np.ndarray) -> dict[str, np.ndarray]:
    """``count`` (in its count shape), ``sum`` (and ``sumsq``) in the key's shape, from a flat merge payload."""
    c, n = spec.count_size, spec.size
    out = {"count": flat[:c].reshape(spec.count_shape), "sum": flat[c : c + n].reshape(spec.shape)}
    if spec.sumsq:
        out["sumsq"] = flat[c + n :].reshape(spec.shape)
    return out


def moments(
    count: np.ndarray, total: np.ndarray, sumsq: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """``mean = sum / count`` and ``var = max(sumsq / count - mean², 0)``; 0 where count is 0."""
    safe = np.where(count > 0, count, 1.0)
    mean = np.where(count > 0, total / safe, 0.0)
    if sumsq is None:
        return mean, None
    var = np.where(count > 0, np.maximum(sumsq / safe - mean * mean, 0.0), 0.0)
    return mean, var


def own_substituted(aggregate: np.ndarray, own_as_folded: np.ndarray | None, own_current: np.ndarray) -> np.ndarray:
    """A collector's view: everybody else's data as of the last pull plus all of its own up to now."""
    if own_as_folded is None:
        return aggregate + own_current
    return (aggregate - own_as_folded) + own_current
