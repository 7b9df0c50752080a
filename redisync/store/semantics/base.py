"""What every semantics is made of, and the checks they share.

A semantics is one module beside this one (``broadcast``, ``merge``, ``maximum``): its key spec, its
report model, its reference fold (the pure-Python twin of its Lua module,
``lua/semantics/<name>.lua``), its snapshot check and the view it hands collectors. `SpecBase` is the
contract each spec fills in; everything outside the semantics modules calls these methods, so a new
semantics is one new module, its Lua module and its registry entry.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from ... import errors

MAX_ELEMENTS = 1 << 22  # 32 MiB per vector: far beyond any curriculum state, well under Redis' 512 MB
LE_F64 = np.dtype("<f8")
Vector = NDArray[np.float64]  # a flat float64 vector: a payload, a slot, a fleet value
S = TypeVar("S", bound="SpecBase")

# (part name, shape, number of values, whether it must be non-negative), in payload order
Part = tuple[str, tuple[int, ...], int, bool]
# the snapshot's typed error, to raise: bad(where, what)
Bad = Callable[[str, str], Exception]


def age_s(now_us: int, then_us: str | None) -> float | None:
    """Seconds from a stored time (µs, decimal) to ``now_us``; None where none is stored."""
    return None if not then_us else max(now_us - int(then_us), 0) / 1e6


def vector(raw: bytes) -> Vector:
    """A writable float64 vector from little-endian payload bytes."""
    return np.frombuffer(raw, dtype=LE_F64).astype(np.float64)


@dataclass
class Slot:
    """One shard's last report of a merge key, as folded."""

    incarnation: int
    seq: int
    at_us: int
    payload: Vector


@dataclass
class KeyState:
    """One key as the reference fold holds it: its version, fleet value and what its semantics keeps
    beside it (broadcast: the writer; merge: the live slots and the retired history)."""

    version: int = 0
    value: Vector | None = None
    writer: int | None = None
    slots: dict[int, Slot] = field(default_factory=dict)
    retired: Vector | None = None


@dataclass(frozen=True)
class Fold:
    """One key of one report, as a semantics' reference fold sees it."""

    shard_id: int
    incarnation: int
    seq: int
    payload: Vector
    now_us: int
    resumed: bool  # this incarnation resumed the key from a checkpoint
    alive: Mapping[int, int]  # per shard id: when its lease runs out in the run's served clock (µs; -1: given up)
    served_us: int  # the run's served clock at this fold (lua/clock.lua)
    # per shard id that gave its lease up: when, in the served clock (lua/lease.lua scores it so in lease_ends)
    ended: Mapping[int, int] = field(default_factory=dict)
    # per other shard id whose slot leaves at this fold, why (`departed`: the envelope's judgement, before the fold)
    gone: Mapping[int, Gone] = field(default_factory=dict)


Gone = Literal["stale", "lapsed"]


def departed(
    written_us: Mapping[int, int],
    report: Fold,
    lifecycle: str,
    stale_after_s: float | None,
    grace_s: float | None,
) -> dict[int, Gone]:
    """Who has left a key that keeps a slot per shard, judged by the fold's envelope before the key's
    semantics folds the report (the twin of ``lua/lifecycle.lua``): of the writers other than the
    folding shard (``written_us``: when each last wrote), a state key's slot not refreshed for
    ``stale_after_s`` is 'stale'; a slot whose shard's lease ran out more than ``grace_s`` ago in the
    run's served clock, or (a state key) was given up, is 'lapsed' (a history key: when it gave the lease
    up counts, ``report.ended``). A shard that never leased is not judged."""
    out: dict[int, Gone] = {}
    for other, at_us in written_us.items():
        if other == report.shard_id:
            continue
        if lifecycle == "state" and stale_after_s is not None and report.now_us - at_us > stale_after_s * 1e6:
            out[other] = "stale"
        ended = report.alive.get(other)
        if ended is not None and ended < 0 and lifecycle == "history":
            ended = report.ended.get(other)
        if (
            grace_s is not None
            and ended is not None
            and ((ended < 0 and lifecycle == "state") or report.served_us - ended > grace_s * 1e6)
        ):
            out.setdefault(other, "lapsed")
    return out


class SpecBase(BaseModel):
    """A key's declaration: its shape, and what its semantics does with reports of it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    semantics: str  # its name, as the schema and the fold script know it (a Literal in each spec)
    shape: tuple[int, ...]

    # the data-hash field that holds the fleet value (what a pull reads), and the report's model
    stored_field: ClassVar[str]
    report_model: ClassVar[type[ReportBase]]
    # whether the key keeps a slot per shard: the envelope then judges who has left it (`departed`)
    slots: ClassVar[bool] = False

    @field_validator("shape", mode="before")
    @classmethod
    def _shape(cls, v: Any) -> Any:
        if isinstance(v, int):
            return (v,)
        return v

    @field_validator("shape")
    @classmethod
    def _shape_ok(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(d <= 0 for d in v):
            raise ValueError(f"every dimension must be positive, got {v}")
        if math.prod(v) > MAX_ELEMENTS:
            raise ValueError(f"shape {v} holds more than {MAX_ELEMENTS} elements")
        return v

    @property
    def size(self) -> int:
        """The number of elements of the key's value."""
        return math.prod(self.shape)

    @property
    def width(self) -> int:
        """float64 values per report: the parts laid end to end."""
        return sum(size for _, _, size, _ in self.payload_parts())

    # ------------------------------------------------------------------ the contract
    @abstractmethod
    def payload_parts(self) -> tuple[Part, ...]:
        """The report's parts in payload order."""

    def coerce(self, name: str, raw: Any) -> ReportBase:
        """The report model of this key from a model or a mapping, or a typed error."""
        report: ReportBase = coerce_with(self.report_model, name, self.semantics, raw)
        return report

    def refuses_writer(self, shard_id: int) -> str | None:
        """Why ``shard_id`` may not report this key (None: it may)."""
        return None

    def register_fields(self) -> dict[str, str]:
        """The key-meta fields ``register.lua`` writes from the spec beyond its name, shape and size (the
        folds trust them, so a snapshot's must be these): an owner and a staleness for every key, empty
        where the semantics has none, and what the semantics adds."""
        return {"owner": "", "stale_after_s": ""}

    def meta_fields(self, name: str) -> dict[str, str]:
        """The key-meta fields that declare the key, as ``register.lua`` writes them (the folds trust
        them, so a snapshot's must be these): its name, shape, sizes, the semantics' own fields and
        the declaration the fold parses."""
        return {
            "name": name,
            "shape": "x".join(map(str, self.shape)) or "scalar",
            "size": str(self.size),
            "width": str(self.width),
            **self.register_fields(),
            "declared": self.declared(),
        }

    def initial_meta(self) -> dict[str, str]:
        """The key-meta fields of state a registered key starts from (none unless the semantics keeps some)."""
        return {}

    def initial_data(self) -> dict[str, bytes]:
        """The data-hash fields a registered key starts from (none: the first report writes them)."""
        return {}

    def declared(self) -> str:
        """The key's declaration as the fold reads it, one key-meta field (``declared``) instead of
        seven: ``width|count_size|size|stale_after_s|lease_grace_s|lifecycle|owner`` (each field
        read costs the fold about 2 400 instructions; it parses a declaration once per Lua VM)."""
        fields = self.register_fields()
        return "|".join(
            [
                str(self.width),
                fields.get("count_size", "0"),
                str(self.size),
                fields["stale_after_s"],
                fields.get("lease_grace_s", ""),
                fields.get("lifecycle", ""),
                fields["owner"],
            ]
        )

    @abstractmethod
    def check_payload(self, payload: Vector) -> str | None:
        """The fold's check of a payload's values, element by element in payload order: the
        rejection reason, or None."""

    @abstractmethod
    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The key after folding ``report`` into ``state`` (a new state; ``state`` is left as it was),
        or the rejection reason: what its Lua module's check and apply do, bit for bit."""

    def new_state(self) -> KeyState:
        """The key as registered, before any report."""
        return KeyState()

    def check_stored(self, name: str, meta: dict[str, bytes], data: dict[str, bytes], bad: Bad) -> None:
        """A snapshot's hashes of this key, checked before a restore (and made consistent where they
        hold derived data): every data field is one this semantics writes, of its size, finite."""
        for fld, raw in data.items():
            if fld != self.stored_field:
                raise bad(f"key {name!r}", f"unexpected data field {fld!r}")
            if len(raw) != 8 * self.width:
                raise bad(f"key {name!r}", f"{fld} is {len(raw)} bytes, the key needs {8 * self.width}")
            if not np.isfinite(vector(raw)).all():
                raise bad(f"key {name!r}", f"{fld} holds a non-finite value")

    def parts_of(self, flat: Vector) -> dict[str, Vector]:
        """A flat vector of this key in its parts, each in its shape."""
        out, at = {}, 0
        for part, shape, size, _ in self.payload_parts():
            out[part] = flat[at : at + size].reshape(shape)
            at += size
        return out

    def others(self, value: Vector | None, own_slot: Vector | None) -> Vector | None:
        """What the rest of the fleet holds, flat: the fleet value itself, unless the semantics keeps
        the caller's own part in it (merge)."""
        return value

    def view(
        self, name: str, value: Vector | None, own_slot: Vector | None, own_current: Mapping[str, Any]
    ) -> dict[str, Vector]:
        """The fleet value a collector acts on, in parts, given its own report of now (only merge
        substitutes it: its fleet value holds the caller's own last slot)."""
        return {} if value is None else self.parts_of(value)

    def keeps_slot_across_lives(self) -> bool:
        """Whether a new process of a shard that did not resume the key still finds its previous
        life's slot its own (a pull hands it back): only where the semantics keeps slots that live on."""
        return False

    def moments(self, name: str, parts: Mapping[str, Vector]) -> tuple[Vector, Vector | None]:
        """The fleet ``(mean, var)`` of the key's value in ``parts``: only pooled statistics have them."""
        raise errors.ConfigurationError(f"{name}: moments are a merge key's; this key is {self.semantics}")

    def metrics(self, name: str, parts: Mapping[str, Vector]) -> dict[str, float]:
        """Flat, logger-ready figures of the fleet value: a scalar value by itself, nothing for a vector."""
        value = parts.get("value")
        return {} if value is None or value.size != 1 else {f"redisync/{name}/value": float(value)}

    def describe(self, meta: Mapping[str, str], read: Callable[[list[str]], list[Any]], now_us: int) -> dict[str, Any]:
        """What ``redisync inspect`` shows of the key beyond its semantics, shape and version, from
        its key-meta fields (``meta``) and its data fields (``read(fields)``: their stored bytes)."""
        return {}

    def drift_measure(self) -> str | None:
        """How far a shard's part may be from the fleet's (`redisync.inspection.drift`): ``moments``
        (offsets in pooled standard deviations), ``distribution`` (total variation), or None."""
        return None


class ReportBase(BaseModel):
    """A report of one key: its parts, checked by `vectors` against the key's spec."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    def vectors(self, name: str, spec: SpecBase) -> list[Vector]:
        """The report's parts as fresh float64 arrays of their shapes, finite (and non-negative
        where the part must be), in payload order; a typed error names the first problem."""
        return [
            checked(name, part, getattr(self, part), shape, nonneg=nonneg)
            for part, shape, _, nonneg in spec.payload_parts()
        ]


def coerce_with(model: type[ReportBase], name: str, semantics: str, raw: Any) -> Any:
    """``raw`` as ``model``: a model of it as is, a mapping validated, anything else refused."""
    if isinstance(raw, model):
        return raw
    if isinstance(raw, ReportBase):
        raise errors.MalformedReport(name, f"a {semantics} key needs a {model.__name__}, got {type(raw).__name__}")
    if not isinstance(raw, Mapping):
        raise errors.MalformedReport(name, f"expected a mapping or {model.__name__}, got {type(raw).__name__}")
    try:
        return model(**raw)
    except ValidationError as e:
        raise errors.MalformedReport(name, first_error(e)) from None
    except TypeError as e:  # non-string mapping keys
        raise errors.MalformedReport(name, str(e)) from None


HALF_PRECISION = ("torch.bfloat16", "torch.float16")  # read as float32, which holds each of their values exactly


def plain_numbers(v: Any) -> Any:
    """A report part as numbers numpy can read: a tensor without its autograd graph (its values are
    what is reported; a tensor that requires grad is still a value), a half-precision one as float32
    (numpy has no bfloat16). Both workers take parts this way."""
    detach = getattr(v, "detach", None)
    if not callable(detach):
        return v
    v = detach()
    return v.float() if str(getattr(v, "dtype", "")) in HALF_PRECISION else v


def as_float64(v: Any) -> Vector:
    """Numbers (ints, floats, arrays or tensors of them) as float64; strings, bools and objects are refused."""
    try:
        arr = np.asarray(plain_numbers(v))
    except (TypeError, ValueError, RuntimeError) as e:  # (a tensor on a device numpy cannot read)
        raise ValueError(f"not an array of numbers: {e}") from None
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"expected numbers, got {type(v).__name__} of {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def checked(name: str, part: str, raw: Any, shape: tuple[int, ...], *, nonneg: bool) -> Vector:
    """``raw`` as a fresh float64 array of ``shape``, finite (and non-negative), or a typed error."""
    if type(raw) is np.ndarray and raw.dtype == np.float64:  # the common case, without a conversion
        arr = raw
    else:
        try:
            arr = as_float64(raw)
        except ValueError as e:
            raise errors.MalformedReport(name, f"{part}: {e}") from None
    if arr.shape != shape:
        try:
            arr = np.broadcast_to(arr, shape)
        except ValueError:
            hint = (
                " (one count per report; declare elementwise_count=True for per-element counts)"
                if part == "count" and shape == ()
                else ""
            )
            raise errors.ShapeMismatch(
                name, f"{part} has shape {arr.shape}, it must broadcast to {shape}{hint}"
            ) from None
    finite = np.isfinite(arr)
    if not finite.all():
        idx = first_index(~finite)
        raise errors.NonFiniteValue(name, f"{part}{list(idx)} is {arr[idx]}")
    if nonneg and arr.size and float(arr.min()) < 0:
        idx = first_index(arr < 0)
        raise errors.NegativeValue(name, f"{part}{list(idx)} is {arr[idx]} (must be >= 0)")
    return np.array(arr, dtype=np.float64, order="C")  # a copy: later edits by the caller change nothing


def first_index(mask: NDArray[np.bool_]) -> tuple[int, ...]:
    """The index of the first True element, as plain ints."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape)) if mask.shape else ()


def first_error(e: ValidationError) -> str:
    """A pydantic error's first problem, with where it is."""
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"{loc}: {err['msg']}" if loc else err["msg"]


def build(cls: type[S], **kw: Any) -> S:
    """A spec from its fields, or `InvalidSchema` naming the first problem."""
    try:
        return cls(**kw)
    except ValidationError as e:
        raise errors.InvalidSchema(f"{cls.__name__}: {first_error(e)}") from None
