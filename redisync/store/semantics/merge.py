"""merge: per-shard slots of cumulative statistics; the fleet value is their exact sum.

For what every shard observes part of (a failure EMA, normaliser moments, a histogram of env
levels): each shard's last report is its slot, the fleet value the sum of the retired history and
the live slots, recomputed at every fold in a fixed order (two levels of stored sums: the slots
summed per sub-group of SUB consecutive shard ids, the sub-group sums per group of SUBS sub-groups,
then the history and the groups, all ascending). Its error is therefore bounded by the live values
alone: each live value passes through at most 3 + 3 + G additions for G groups (and the history),
so ``|agg − Σ live| ≤ (6 + G)·2⁻⁵³·Σ|live|`` to first order, however large the values that once
passed through a slot. A fold that would make an aggregate or its moments non-finite is refused.
A collector sees everybody else's slots plus its own state of now (own substitution).

Its Lua: ``lua/semantics/merge.lua`` (its check in four steps, ``merge_live``, ``merge_read``,
``merge_prove``, ``merge_sums``, with the generated ``fold_values``); SUB, SUBS and LAYOUT are written
into it from here by ``scripts/generate_fold_pass.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from ... import errors
from .base import Bad, Fold, KeyState, Part, ReportBase, Slot, SpecBase, Vector, age_s, build, vector

SUB = 4  # shard ids per sub-group (stored as ``sub:<id // SUB>``)
SUBS = 4  # sub-groups per group (stored as ``group:<id // (SUB * SUBS)>``)
# the fold's ``sums_layout`` (sub-groups of 4 ids, groups of 16, a lone sum not stored): a key whose
# sums were laid out otherwise has them all re-made
LAYOUT = "4/16/lone"


def layered_sums(payloads: Mapping[int, Vector], width: int) -> tuple[dict[int, Vector], dict[int, Vector]]:
    """``({q: sum}, {g: sum})``: each sub-group's sum of its slots' payloads in ascending shard order,
    each group's sum of its sub-groups' sums in ascending order, both in ascending order: what the
    fold stores as ``sub:<q>`` and ``group:<g>``."""
    members: dict[int, list[Vector]] = {}
    for shard in sorted(payloads):
        members.setdefault(shard // SUB, []).append(payloads[shard])
    subs = {q: summed(members[q], width) for q in sorted(members)}
    parts: dict[int, list[Vector]] = {}
    for q, sub in subs.items():
        parts.setdefault(q // SUBS, []).append(sub)
    return subs, {g: summed(parts[g], width) for g in sorted(parts)}


def stored_sums(payloads: Mapping[int, Vector], width: int, retired: bool) -> dict[str, Vector]:
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


def group_sums(slots: Mapping[int, Slot], width: int) -> list[Vector]:
    """The group sums of live slots, in ascending group order, as the fold sums them into the aggregate."""
    return list(layered_sums({shard: slot.payload for shard, slot in slots.items()}, width)[1].values())


def finite_moments(spec: MergeSpec, flat: Vector) -> bool:
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


def summed(vectors: list[Vector], width: int) -> Vector:
    """``0 + v₁ + v₂ + …`` in the given order: the fold script's summation, bit for bit."""
    out: Vector = np.zeros(width)
    for v in vectors:
        out = out + v
    return out


class MergeReport(ReportBase):
    """A merge key's report: this shard's cumulative ``count``, ``sum`` (and ``sumsq``)."""

    count: Any
    sum: Any
    sumsq: Any = None

    def vectors(self, name: str, spec: SpecBase) -> list[Vector]:
        """The report's parts as float64 vectors, in the payload's order."""
        assert isinstance(spec, MergeSpec)
        if spec.sumsq and self.sumsq is None:
            raise errors.MalformedReport(name, "the key tracks sumsq but the report has none")
        if not spec.sumsq and self.sumsq is not None:
            raise errors.MalformedReport(name, "the key does not track sumsq but the report carries one")
        return super().vectors(name, spec)


Lifecycle = Literal["history", "state"]
DEFAULT_LEASE_S = 5.0  # a process's lease on its shard id (a Syncer's, an aggregator's): renewed every fifth of it
# a few lease periods (a Syncer leases its shard id for 5 s and renews every second): a collector
# stalled by a long checkpoint write or a swap storm is not dropped, a dead one leaves within ~20 s
DEFAULT_LEASE_GRACE_S = 15.0


class MergeSpec(SpecBase):
    """Per-shard slots of cumulative (count, sum[, sumsq]); the fleet value is their sum.

    ``count`` is one number per report (samples seen, or 1 for a pooled EMA) unless
    ``elementwise_count`` gives every element its own count (a histogram of partial views).

    ``lifecycle`` says what a shard's *fresh* restart means for its previous life's slot:
    ``history`` (counts that accumulate over a run, e.g. normaliser moments) keeps it as retired
    history; ``state`` (a current value, e.g. a failure EMA or a histogram of env levels) drops it.
    A restart that *resumes* the key from a checkpoint takes the slot over in both cases.

    Liveness (``state`` keys): a live process renews a lease on its shard id; once that lease has
    lapsed for longer than ``lease_grace_s``, the shard's slot leaves the aggregate at the next fold
    (a collector that died for good, a run resumed with fewer collectors). ``None``: a slot counts
    until its shard's next life replaces it. A shard that never took a lease (the low-level API
    without a Syncer) is not judged by it. ``stale_after_s`` (``state`` keys; a history key keeps a
    silent shard's samples, whichever fold notices it first) drops a slot not refreshed for that
    long: what a lease cannot see (a process alive but silent).
    """

    semantics: Literal["merge"] = "merge"
    stale_after_s: float | None = Field(default=None, gt=0)
    lease_grace_s: float | None = Field(default=DEFAULT_LEASE_GRACE_S, gt=0)
    sumsq: bool = False
    elementwise_count: bool = False
    lifecycle: Lifecycle = "history"

    stored_field: ClassVar[str] = "agg"
    report_model: ClassVar[type[ReportBase]] = MergeReport

    @property
    def parts(self) -> tuple[str, ...]:
        """The parts of a slot: count, sum (and sumsq)."""
        return ("count", "sum", "sumsq") if self.sumsq else ("count", "sum")

    @property
    def count_size(self) -> int:
        """The number of counts per slot (1, or the size with ``elementwise_count``)."""
        return self.size if self.elementwise_count else 1

    @property
    def count_shape(self) -> tuple[int, ...]:
        """The shape of ``count``."""
        return self.shape if self.elementwise_count else ()

    def payload_parts(self) -> tuple[Part, ...]:
        """count (non-negative), sum (signed) and, if tracked, sumsq (non-negative)."""
        return tuple(
            (part, self.count_shape if part == "count" else self.shape,
             self.count_size if part == "count" else self.size, part != "sum")
            for part in self.parts
        )  # fmt: skip

    def register_fields(self) -> dict[str, str]:
        """The key's metadata fields, as the fold reads them."""
        grace = self.lease_grace_s if self.lifecycle == "state" else None
        return super().register_fields() | {
            "stale_after_s": "" if self.stale_after_s is None else repr(float(self.stale_after_s)),
            "count_size": str(self.count_size),
            "sumsq": str(int(self.sumsq)),
            "lifecycle": self.lifecycle,
            "lease_grace_s": "" if grace is None else repr(float(grace)),
        }

    def initial_meta(self) -> dict[str, str]:
        """No writers yet."""
        return {"writers": ""}

    def initial_data(self) -> dict[str, bytes]:
        """An aggregate of zeros: a pull before any report reads a fleet of nothing counted."""
        return {"agg": bytes(8 * self.width)}

    def check_payload(self, payload: Vector) -> str | None:
        """Check a decoded payload's length and its counts."""
        signed = range(self.count_size, self.count_size + self.size)  # the sum part
        for i, v in enumerate(payload):
            if not np.isfinite(v):
                return "non_finite"
            if v < 0 and i not in signed:
                return "negative"
        return None

    def new_state(self) -> KeyState:
        """The reference's empty state of the key."""
        return KeyState(value=np.zeros(self.width))

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the slot replaced, the aggregate re-made from the live slots."""
        bad = self.check_payload(report.payload)
        if bad:
            return bad
        retired = state.retired
        old = state.slots.get(report.shard_id)
        if (
            old is not None
            and old.incarnation != report.incarnation
            and not report.resumed
            and self.lifecycle == "history"
        ):
            # a fresh restart of a history key: the previous life's counts are kept as retired history
            # (a slot alone is a payload checked when it was folded; a sum of two may overflow)
            if retired is None:
                retired = old.payload.copy()
            else:
                retired = summed([retired, old.payload], self.width)  # 0 + r + o, as the fold sums (−0.0 included)
                if not finite_moments(self, retired):
                    return "non_finite"
        slots = {}
        now_us, alive, served = report.now_us, report.alive, report.served_us
        for other, slot in state.slots.items():
            # a state key's slot leaves once stale or its shard's lease lapsed; a history key keeps it (its
            # samples stay counted, as its shard's fresh restart would retire them: whichever fold comes first)
            stale = (
                self.lifecycle == "state"
                and self.stale_after_s is not None
                and now_us - slot.at_us > self.stale_after_s * 1e6
            )
            grace = self.lease_grace_s if self.lifecycle == "state" else None
            # in the served clock; given up (-1) at a clean stop; a fold after the lease ran out moved its end
            lapsed = grace is not None and other in alive and (alive[other] < 0 or served - alive[other] > grace * 1e6)
            if other != report.shard_id and not (stale or lapsed):
                slots[other] = slot
        slots[report.shard_id] = Slot(report.incarnation, report.seq, now_us, report.payload.copy())
        vectors = ([] if retired is None else [retired]) + group_sums(slots, self.width)
        agg = summed(vectors, self.width)
        if not finite_moments(self, agg):
            return "non_finite"
        return KeyState(version=state.version + 1, value=agg, slots=slots, retired=retired)

    def check_stored(self, name: str, meta: dict[str, bytes], data: dict[str, bytes], bad: Bad) -> None:
        """Every field one a merge key writes, of its size, finite; the writers those of the stored
        slots; the stored sums checked and re-made (`check_sums`)."""
        for fld, raw in data.items():
            record = fld.startswith("counts:")  # the count part of a stored vector
            if fld not in ("agg", "retired") and not fld.removeprefix("counts:").startswith(
                ("slot:", "sub:", "group:")
            ):
                raise bad(f"key {name!r}", f"unexpected data field {fld!r}")
            need = 8 * (self.count_size if record else self.width)
            if len(raw) != need:
                raise bad(f"key {name!r}", f"{fld} is {len(raw)} bytes, the key needs {need}")
            if not np.isfinite(vector(raw)).all():
                raise bad(f"key {name!r}", f"{fld} holds a non-finite value")
        text = {k: v.decode() for k, v in meta.items()}
        writers = [w for w in text.get("writers", "").split(",") if w]
        slots = sorted(f[len("slot:") :] for f in data if f.startswith("slot:"))
        if sorted(writers) != slots or any(f"slot:{w}:incarnation" not in text for w in writers):
            raise bad(f"key {name!r}", f"writers {writers} do not match the stored slots {slots}")
        check_sums(name, self, meta, data, writers, bad)
        # the folds read the writers as ascending shard ids: the list is the slots', in that order
        meta["writers"] = ",".join(str(w) for w in sorted(int(w) for w in writers)).encode()

    def keeps_slot_across_lives(self) -> bool:
        """A state key's slot is the shard's whatever life wrote it; a history key's is its writer's."""
        return self.lifecycle == "state"

    def moments(self, name: str, parts: Mapping[str, Vector]) -> tuple[Vector, Vector | None]:
        """The fleet ``(mean, var)`` (var is None without sumsq)."""
        return moments(parts["count"], parts["sum"], parts.get("sumsq"))

    def metrics(self, name: str, parts: Mapping[str, Vector]) -> dict[str, float]:
        """The pooled count and the sum's total."""
        return {
            f"redisync/{name}/count": float(np.sum(parts["count"])),
            f"redisync/{name}/sum_total": float(np.sum(parts["sum"])),
        }

    def describe(self, meta: Mapping[str, str], read: Callable[[list[str]], list[Any]], now_us: int) -> dict[str, Any]:
        """The pooled count, the retired count, the slots dropped, and per live slot its shard, life,
        seq, age, count and whether it is stale (a state key's stale slot still counts until the
        next fold of the key drops it; a history key keeps it)."""
        writers = [w for w in meta.get("writers", "").split(",") if w]
        raw = read(["agg", "retired"] + [f"slot:{w}" for w in writers])
        first = [float(np.frombuffer(v[:8], "<f8")[0]) if isinstance(v, bytes) and len(v) >= 8 else 0.0 for v in raw]
        slots = []
        for shard, count in zip(writers, first[2:], strict=False):
            age = age_s(now_us, meta[f"slot:{shard}:at_us"])
            limit = self.stale_after_s if self.lifecycle == "state" else None
            slots.append(
                {
                    "shard": int(shard),
                    "incarnation": meta[f"slot:{shard}:incarnation"],
                    "seq": int(meta[f"slot:{shard}:seq"]),
                    "age_s": age,
                    "count": count,
                    "stale": limit is not None and age is not None and age > limit,
                }
            )
        return {
            "count": first[0],
            "stale_after_s": self.stale_after_s,
            "retired_count": first[1],
            "dropped_stale": int(meta.get("dropped_stale", 0)),
            "dropped_lapsed": int(meta.get("dropped_lapsed", 0)),
            "slots": slots,
        }

    def drift_measure(self) -> str | None:
        """Moments with sums of squares; a distribution over several elements; a scalar sum: none."""
        return "moments" if self.sumsq else "distribution" if self.size >= 2 else None

    def others(self, value: Vector | None, own_slot: Vector | None) -> Vector | None:
        """The fleet value without the caller's slot (None when never written)."""
        if value is None:
            return None
        return value if own_slot is None else value - own_slot

    def view(
        self, name: str, value: Vector | None, own_slot: Vector | None, own_current: Mapping[str, Any]
    ) -> dict[str, Vector]:
        """Own substitution: everybody else's data as pulled plus ours as of now (``own_current``:
        this shard's report of now, ``{"count": ..., "sum": ...}``); the result has the same parts, pooled."""
        own = np.concatenate([v.ravel() for v in self.coerce(name, own_current).vectors(name, self)])
        agg = value if value is not None else np.zeros(self.width)
        return self.parts_of(own_substituted(agg, own_slot, own))


def split_parts(spec: MergeSpec, flat: Vector) -> dict[str, Vector]:
    """``count`` (in its count shape), ``sum`` (and ``sumsq``) in the key's shape, from a flat merge payload."""
    return spec.parts_of(flat)


def merge(
    shape: int | tuple[int, ...],
    stale_after_s: float | None = None,
    sumsq: bool = False,
    elementwise_count: bool = False,
    *,
    lifecycle: Lifecycle | None = None,
    lease_grace_s: float | None = DEFAULT_LEASE_GRACE_S,
) -> MergeSpec:
    """A pooled-statistics key (failure EMA, normaliser moments, histograms): one slot per shard
    holding its cumulative own ``count``, ``sum`` (and ``sumsq``); the fleet value is their exact sum.

    Args:
        shape: the shape of ``sum`` (an int for a vector; ``()`` or ``1`` for a scalar).
        stale_after_s: a ``state`` key's slot not refreshed for this long leaves the aggregate at the
            next fold (a process alive but silent); ``None``: never by age.
        sumsq: the slots also hold a sum of squares (a normaliser's second moment).
        elementwise_count: ``count`` has ``shape`` too (a count per element), not one number.
        lifecycle: no default, because either default is wrong for half the keys: ``"state"`` for a
            current value (a failure EMA: a fresh restart replaces the previous life's slot, which
            ``"history"`` would count twice), ``"history"`` for counts that accumulate over the run
            (normaliser moments: the previous life's slot stays counted, which ``"state"`` would drop).
        lease_grace_s: (``state`` keys) how long a shard's lease may have lapsed before its slot
            leaves the aggregate (``None``: never by the lease).
    """
    if lifecycle is None:
        raise errors.InvalidSchema(
            "merge(): say lifecycle='state' (a current value, e.g. a failure EMA: a fresh restart replaces the "
            "previous life's slot) or lifecycle='history' (counts accumulated over the run, e.g. normaliser "
            "moments: the previous life's slot stays counted)"
        )
    if lifecycle == "history" and stale_after_s is not None:
        raise errors.InvalidSchema(
            "merge(): stale_after_s drops a silent shard's slot from a state key; a history key keeps every "
            "sample it was sent (a dead shard's stay counted, as its restart would retire them): leave "
            "stale_after_s unset for lifecycle='history'"
        )
    return build(
        MergeSpec,
        shape=shape,
        stale_after_s=stale_after_s,
        sumsq=sumsq,
        elementwise_count=elementwise_count,
        lifecycle=lifecycle,
        lease_grace_s=lease_grace_s,
    )


def moments(count: Vector, total: Vector, sumsq: Vector | None = None) -> tuple[Vector, Vector | None]:
    """``mean = sum / count`` and ``var = max(sumsq / count - mean², 0)``; 0 where count is 0."""
    safe = np.where(count > 0, count, 1.0)
    mean = np.where(count > 0, total / safe, 0.0)
    if sumsq is None:
        return mean, None
    var = np.where(count > 0, np.maximum(sumsq / safe - mean * mean, 0.0), 0.0)
    return mean, var


def own_substituted(aggregate: Vector, own_as_folded: Vector | None, own_current: Vector) -> Vector:
    """A collector's view: everybody else's data as of the last pull plus all of its own up to now."""
    if own_as_folded is None:
        return aggregate + own_current
    return (aggregate - own_as_folded) + own_current


def check_sums(
    name: str, spec: MergeSpec, info: dict[str, bytes], data: dict[str, bytes], writers: list[str], bad: Bad
) -> None:
    """The folds trust stored sums (each re-makes its own sub-group and group only, checking their
    count records): every stored sub-group and group sum must be its parts' sum (a lone one is not
    stored: `stored_sums`), the aggregate the sum of the history and the groups, and every
    count record (``counts:<field>``) the count part of its field, as the fold computes them; a
    missing one is filled in. A snapshot whose sums were laid out otherwise (by an older redisync) has
    them all re-made from its slots: they are derived data."""
    if not all(w.isdigit() for w in writers):
        raise bad(f"key {name!r}", f"writers {writers} are not shard ids")
    width, cut = spec.width, spec.count_size
    slots = {int(w): vector(data[f"slot:{w}"]) for w in writers}
    groups = layered_sums(slots, width)[1]
    retired = data.get("retired")
    agg = summed(([] if retired is None else [vector(retired)]) + list(groups.values()), width)
    sums = stored_sums(slots, width, retired is not None)
    counts = {f"counts:{f}": v[:cut] for f, v in (sums | {f"slot:{w}": v for w, v in slots.items()}).items()}
    derived = sums | {"agg": agg} | counts
    parts = {"sub": "its slots", "group": "its sub-groups", "agg": "the retired history and the slots"}
    if info.get("sums_layout", b"") == LAYOUT.encode():
        for fld in [f for f in data if f.startswith(("sub:", "group:", "counts:"))]:
            if fld not in derived:
                raise bad(f"key {name!r}", f"{fld} belongs to no stored slot")
        for fld, expected in derived.items():
            raw = data.get(fld)
            if raw is not None and not np.array_equal(vector(raw), expected):
                what = (
                    "the count part of " + fld[len("counts:") :]
                    if fld.startswith("counts:")
                    else ("the sum of " + parts[fld.split(":")[0]])
                )
                raise bad(f"key {name!r}", f"{fld} disagrees with {what}")
    for fld in [f for f in data if f.startswith(("sub:", "group:", "counts:"))]:
        del data[fld]
    data.update({fld: np.ascontiguousarray(v, dtype="<f8").tobytes() for fld, v in derived.items()})
    info["sums_layout"] = LAYOUT.encode()


SPEC = MergeSpec  # the registry's entry (see __init__)
