"""merge: per-shard slots of cumulative statistics; the fleet value is their exact sum.

For what every shard observes part of (a failure EMA, normaliser moments, a histogram of env
levels): each shard's last report is its slot, the fleet value the sum of the retired history and
the live slots, **correctly rounded**: the exact sum rounded once to float64, so a function of the
last reports and not of the order in which they arrived. The fold keeps that exact sum as canonical
planes (`exact_planes`: the rounded sum, then the rest rounded, …; two planes almost always) and
updates it by what changed — the folding shard's new slot in, its previous one out, a lapsed slot
out — so its cost does not grow with the number of live slots. A merge value's magnitude is at most
`LIMIT` (2¹⁰⁰⁰), so no sum of them overflows; a fold whose fleet moments would (a mean's square, a
count below one) is refused. A collector sees everybody else's slots plus its own state of now (own
substitution).

Its Lua: ``lua/semantics/merge.lua`` (its check in three steps, ``merge_live``, ``merge_read``,
``merge_sums``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from ... import errors
from .base import Bad, Fold, KeyState, Part, ReportBase, Slot, SpecBase, Vector, age_s, build, vector

# a merge value's magnitude is at most LIMIT (2¹⁰⁰⁰, about 1.07e301): the exact sum of fewer than 2²³
# such values (live slots and retired lives) is then finite, and no partial sum of them overflows,
# whatever their order
LIMIT = 2.0**1000
# the fold's ``sums_layout``: the aggregate kept as the canonical planes of its exact sum (``agg``,
# ``agg_lo``; ``retired``, ``retired_lo``); a key whose sums were kept otherwise has them re-made
LAYOUT = "exact/1"


def exact_planes(vectors: Sequence[Vector], width: int) -> Vector:
    """The exact element-wise sum of ``vectors`` in its canonical planes, K ≥ 2 rows: row 1 is the sum
    correctly rounded to float64, each next row the rest correctly rounded (``c₁ = fl(Σ)``,
    ``c₂ = fl(Σ − c₁)``, …) until nothing is left, zeros beyond. A function of the multiset of
    vectors, not of their order: what the fold stores as ``agg`` (row 1) and ``agg_lo`` (the rest).
    (Every value below `LIMIT` in magnitude, so no partial sum overflows.)"""
    columns: list[list[float]] = []
    for j in range(width):
        xs = [float(v[j]) for v in vectors]
        comps: list[float] = []
        while True:
            c = math.fsum(xs + [-x for x in comps])  # correctly rounded (math.fsum is exact until it rounds)
            if c == 0.0:
                break
            comps.append(c)
        columns.append(comps)
    k = max(2, max((len(c) for c in columns), default=0))
    out = np.zeros((k, width))
    for j, comps in enumerate(columns):
        out[: len(comps), j] = comps
    return out + 0.0  # (no −0.0: an exact sum of zero is +0.0)


def exact_pieces(vectors: Sequence[Vector], width: int, nonneg: Sequence[bool] | None = None) -> Vector:
    """The exact element-wise sum of ``vectors`` as pieces a slot can hold, ``[K ≥ 1, width]``: each
    within ±`LIMIT`, their sum the exact sum, each piece what is left correctly rounded, except in the
    ``nonneg`` elements (a count, a sum of squares: a sum of non-negative values), where it is rounded
    toward zero, so that every piece is non-negative as a slot's must be. Two pieces
    almost always; more only where the sum is beyond `LIMIT` (what one aggregator forwards for a
    sub-run whose shards report near it: `redisync.aggregation`)."""
    columns: list[list[float]] = []
    for j in range(width):
        xs = [float(v[j]) for v in vectors]
        comps: list[float] = []
        while True:
            c = math.fsum(xs + [-x for x in comps])
            if c == 0.0:
                break
            if abs(c) > LIMIT:
                c = math.copysign(LIMIT, c)
            elif nonneg is not None and nonneg[j] and c > 0.0 and math.fsum(xs + [-x for x in comps] + [-c]) < 0.0:
                c = math.nextafter(c, 0.0)  # (rounded up: one ulp down, so what is left stays non-negative)
            comps.append(c)
        columns.append(comps)
    out = np.zeros((max(1, max((len(c) for c in columns), default=0)), width))
    for j, comps in enumerate(columns):
        out[: len(comps), j] = comps
    return out + 0.0


def planes_of(raw_hi: bytes, raw_lo: bytes | None, width: int) -> Vector:
    """An exact vector's planes from its stored row 1 and the rows after it (none: zeros)."""
    lo = vector(raw_lo).reshape(-1, width) if raw_lo else np.zeros((1, width))
    return np.vstack([vector(raw_hi).reshape(1, width), lo])


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
# how long a history key keeps a departed shard's slot apart (its lease ended, or was given up, that
# long ago in the run's served clock, which stops with the run's calls: a run stopped whole does not
# age) before retiring it into the retired planes: longer than a shard is gone while the rest of its
# run goes on (a crash and restart, a preemption) and then resumes, taking its slot over exactly; the
# run then holds the slots of the shards live, or gone within the last hour, not of every id
DEFAULT_RETIRE_AFTER_S = 3600.0


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
    until its shard's next life replaces it. A ``history`` key retires a departed shard's slot (its
    lease ended, or was given up, ``retire_after_s`` ago): its samples stay counted, exactly, in the
    retired history, and the key stops holding the slot, so a run's memory follows its live fleet
    (``None``: every slot kept until its shard's next life). A shard that resumes after that counts
    its resumed samples again: set ``retire_after_s`` above any pause a run resumes across. A shard that never took a lease (the low-level API
    without a Syncer) is not judged by it. ``stale_after_s`` (``state`` keys; a history key keeps a
    silent shard's samples, whichever fold notices it first) drops a slot not refreshed for that
    long: what a lease cannot see (a process alive but silent).
    """

    semantics: Literal["merge"] = "merge"
    stale_after_s: float | None = Field(default=None, gt=0)
    lease_grace_s: float | None = Field(default=DEFAULT_LEASE_GRACE_S, gt=0)
    retire_after_s: float | None = Field(default=DEFAULT_RETIRE_AFTER_S, gt=0)
    sumsq: bool = False
    elementwise_count: bool = False
    lifecycle: Lifecycle = "history"

    stored_field: ClassVar[str] = "agg"
    report_model: ClassVar[type[ReportBase]] = MergeReport
    slots: ClassVar[bool] = True

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
        return super().register_fields() | {
            "stale_after_s": "" if self.stale_after_s is None else repr(float(self.stale_after_s)),
            "count_size": str(self.count_size),
            "sumsq": str(int(self.sumsq)),
            "lifecycle": self.lifecycle,
            "lease_grace_s": "" if self.grace_s is None else repr(float(self.grace_s)),
        }

    @property
    def grace_s(self) -> float | None:
        """How long after its shard's lease ended a slot leaves the key: a state key's ``lease_grace_s``
        (dropped), a history key's ``retire_after_s`` (retired); what the fold reads as the grace."""
        return self.lease_grace_s if self.lifecycle == "state" else self.retire_after_s

    def initial_meta(self) -> dict[str, str]:
        """No writers yet."""
        return {"writers": ""}

    def initial_data(self) -> dict[str, bytes]:
        """An aggregate of zeros: a pull before any report reads a fleet of nothing counted."""
        return {"agg": bytes(8 * self.width)}

    def check_payload(self, payload: Vector) -> str | None:
        """Check a decoded payload: finite and within ±`LIMIT`, counts (and sums of squares) not negative."""
        signed = range(self.count_size, self.count_size + self.size)  # the sum part
        for i, v in enumerate(payload):
            if not np.isfinite(v) or abs(v) > LIMIT:
                return "non_finite"
            if v < 0 and i not in signed:
                return "negative"
        return None

    def new_state(self) -> KeyState:
        """The reference's empty state of the key."""
        return KeyState(value=np.zeros(self.width))

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the slot replaced, the aggregate the exact sum of the
        retired history and the live slots, correctly rounded."""
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
            retired = exact_planes(([] if retired is None else list(retired)) + [old.payload], self.width)
            if not finite_moments(self, retired[0]):
                return "non_finite"
        slots = {}
        departed = []
        for other, slot in state.slots.items():
            # (the envelope judged who left, `departed`) a state key drops the slot; a history key
            # retires it: its samples stay counted, moved into the retired history
            if other == report.shard_id:
                continue
            if report.gone.get(other) == "lapsed" and self.lifecycle == "history":
                departed.append(slot.payload)
            elif other not in report.gone:
                slots[other] = slot
        if departed:
            retired = exact_planes(([] if retired is None else list(retired)) + departed, self.width)
        slots[report.shard_id] = Slot(report.incarnation, report.seq, report.now_us, report.payload.copy())
        vectors = ([] if retired is None else list(retired)) + [slot.payload for slot in slots.values()]
        agg = exact_planes(vectors, self.width)[0]
        if not finite_moments(self, agg):
            return "non_finite"
        return KeyState(version=state.version + 1, value=agg, slots=slots, retired=retired)

    def check_stored(self, name: str, meta: dict[str, bytes], data: dict[str, bytes], bad: Bad) -> None:
        """Every field one a merge key writes, of its size, finite; the writers those of the stored
        slots; the exact sum checked, or re-made (`check_sums`)."""
        for fld, raw in data.items():
            record = fld.startswith("counts:")  # (an earlier layout's count records: re-made, see check_sums)
            if fld not in ("agg", "retired", "agg_lo", "retired_lo") and not fld.removeprefix("counts:").startswith(
                ("slot:", "sub:", "group:")
            ):
                raise bad(f"key {name!r}", f"unexpected data field {fld!r}")
            need = 8 * (self.count_size if record else self.width)
            planes = fld in ("agg_lo", "retired_lo")  # one row or more
            if (len(raw) % need or not raw) if planes else len(raw) != need:
                what = f"a whole number of rows of {need}" if planes else str(need)
                raise bad(f"key {name!r}", f"{fld} is {len(raw)} bytes, the key needs {what}")
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
        """The pooled count, the retired count, the slots dropped (a state key) or retired because
        their shard departed (a history key), and per live slot its shard, life,
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
            "lifecycle": self.lifecycle,
            "retired_count": first[1],
            "dropped_stale": int(meta.get("dropped_stale", 0)),
            "dropped_lapsed": int(meta.get("dropped_lapsed", 0)),
            "retired_departed": int(meta.get("retired_departed", 0)),
            "slots": slots,
        }

    def stored_parts(self, data: Mapping[str, bytes]) -> tuple[dict[str, Vector] | None, dict[int, dict[str, Vector]]]:
        """From a data hash as stored (`Store.key_vectors`): the aggregate and every live slot, in
        parts (``count``, ``sum``, ``sumsq``), the slots by shard."""
        agg = data.get("agg")
        slots = {int(f.split(":")[1]): self.parts_of(vector(raw)) for f, raw in data.items() if f.startswith("slot:")}
        return (None if agg is None else self.parts_of(vector(agg))), slots

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
    retire_after_s: float | None = DEFAULT_RETIRE_AFTER_S,
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
        retire_after_s: (``history`` keys) how long after its shard's lease ended (or was given up) a
            slot is retired: its samples stay counted in the retired history and the key stops holding
            it (``None``: kept until its shard's next life). Above any pause a run resumes across.
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
        retire_after_s=retire_after_s,
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
    """The folds trust the stored exact sum (each adds what changed): with this layout it must be the
    canonical planes of the retired history plus the slots (`exact_planes`), else it is refused;
    a snapshot whose sums were kept otherwise (by an older redisync) has them re-made from its slots
    and its retired history (taken as exact), and the earlier layout's fields dropped."""
    if not all(w.isdigit() for w in writers):
        raise bad(f"key {name!r}", f"writers {writers} are not shard ids")
    width = spec.width
    current = info.get("sums_layout", b"") == LAYOUT.encode()
    retired = None
    if "retired" in data:
        retired = planes_of(data["retired"], data.get("retired_lo") if current else None, width)
    slots = [vector(data[f"slot:{w}"]) for w in writers]
    agg = exact_planes(([] if retired is None else list(retired)) + slots, width)
    if current and "agg" in data and "agg_lo" in data:  # (one left out is re-made)
        stored = planes_of(data["agg"], data["agg_lo"], width)
        if stored.shape != agg.shape or not np.array_equal(stored, agg):
            raise bad(f"key {name!r}", "agg and agg_lo are not the exact sum of the retired history and the slots")
    for fld in [f for f in data if f.startswith(("sub:", "group:", "counts:"))]:
        del data[fld]
    data["agg"], data["agg_lo"] = _bytes(agg[0]), _bytes(agg[1:])
    if retired is not None:
        retired = exact_planes(list(retired), width)  # (canonical: an earlier layout's is one plane)
        data["retired"], data["retired_lo"] = _bytes(retired[0]), _bytes(retired[1:])
    info["sums_layout"] = LAYOUT.encode()


def _bytes(v: Vector) -> bytes:
    return np.ascontiguousarray(v, dtype="<f8").tobytes()


SPEC = MergeSpec  # the registry's entry (see __init__)
