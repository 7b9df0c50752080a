"""Key specs, the run schema and shard reports, as pydantic v2 models.

A report is validated here, on the client, before anything is sent: arrays become float64
of the key's shape, everything is finite, counts and sums of squares are non-negative,
unknown keys and oversize payloads are refused. The fold script repeats every check on the
server, because a client is not trusted.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import struct
from typing import Annotated, Any, Literal, Mapping, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import errors

KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}/[A-Za-z0-9_.-]{1,64}$")
MAX_ELEMENTS = 1 << 22  # 32 MiB per vector: far beyond any curriculum state, well under Redis' 512 MB


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: tuple[int, ...]

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
        return math.prod(self.shape)


class BroadcastSpec(_Spec):
    """Last-writer-wins register; with ``owner``, only that shard may write."""

    semantics: Literal["broadcast"] = "broadcast"
    owner: int | None = Field(default=None, ge=0)

    @property
    def width(self) -> int:
        """float64 values per report: the value."""
        return self.size


Lifecycle = Literal["history", "state"]
# a few lease periods (a Syncer leases its shard id for 5 s and renews every second): a collector
# stalled by a long checkpoint write or a swap storm is not dropped, a dead one leaves within ~20 s
DEFAULT_LEASE_GRACE_S = 15.0


class MergeSpec(_Spec):
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

    @property
    def parts(self) -> tuple[str, ...]:
        return ("count", "sum", "sumsq") if self.sumsq else ("count", "sum")

    @property
    def count_size(self) -> int:
        return self.size if self.elementwise_count else 1

    @property
    def count_shape(self) -> tuple[int, ...]:
        return self.shape if self.elementwise_count else ()

    @property
    def width(self) -> int:
        """float64 values per report: count, sum and (if tracked) sumsq, laid end to end."""
        return self.count_size + self.size * (len(self.parts) - 1)


KeySpec = Annotated[Union[BroadcastSpec, MergeSpec], Field(discriminator="semantics")]


def broadcast(shape: int | tuple[int, ...], owner: int | None = None) -> BroadcastSpec:
    """A last-writer-wins key (penalty scale, curriculum stage, a learner-owned normaliser)."""
    return _build(BroadcastSpec, shape=shape, owner=owner)


def merge(
    shape: int | tuple[int, ...],
    stale_after_s: float | None = None,
    sumsq: bool = False,
    elementwise_count: bool = False,
    *,
    lifecycle: Lifecycle | None = None,
    lease_grace_s: float | None = DEFAULT_LEASE_GRACE_S,
) -> MergeSpec:
    """A pooled-statistics key (failure EMA, normaliser moments, histograms).

    ``lifecycle`` has no default, because either default is wrong for half the keys: ``"state"``
    for a current value (a failure EMA: a fresh restart replaces the previous life's slot, which
    ``"history"`` would count twice), ``"history"`` for counts that accumulate over the run
    (normaliser moments: the previous life's slot stays counted, which ``"state"`` would drop).
    ``lease_grace_s`` (``state`` keys): how long a shard's lease may have lapsed before its slot
    leaves the aggregate (``None``: never by the lease)."""
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
    return _build(
        MergeSpec,
        shape=shape,
        stale_after_s=stale_after_s,
        sumsq=sumsq,
        elementwise_count=elementwise_count,
        lifecycle=lifecycle,
        lease_grace_s=lease_grace_s,
    )


def _build(cls: type[_Spec], **kw: Any) -> Any:
    try:
        return cls(**kw)
    except ValidationError as e:
        raise errors.InvalidSchema(f"{cls.__name__}: {_first_error(e)}") from None


class Limits(BaseModel):
    """Per-run limits, fixed by the first registration."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_report_bytes: int = Field(default=64 << 20, gt=0)
    stream_maxlen: int = Field(default=1000, ge=1)
    dead_letter_maxlen: int = Field(default=10_000, ge=1)
    # the dead-letter stream's payload bytes, all entries together: each entry keeps at most
    # dead_letter_max_bytes / dead_letter_maxlen bytes of the refused report (the rest is cut, and said)
    dead_letter_max_bytes: int = Field(default=64 << 20, ge=1)
    # the reports stream keeps each accepted report's envelope; its payloads too only when asked (an
    # audit trail costs a copy of every report in Redis' memory and in the fold's time)
    stream_payloads: bool = False


class Schema(BaseModel):
    """All key specs of a run. Registering stores it; the first registration wins."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: dict[str, KeySpec]

    @field_validator("keys")
    @classmethod
    def _names(cls, v: dict[str, Any]) -> dict[str, Any]:
        if not v:
            raise ValueError("a schema needs at least one key")
        for name in v:
            if not KEY_NAME.match(name):
                raise ValueError(f"key name {name!r} must look like 'term/name' (letters, digits, '_', '.', '-')")
        return dict(sorted(v.items()))

    @classmethod
    def of(cls, keys: Mapping[str, Any]) -> "Schema":
        try:
            return cls(keys=dict(keys))
        except ValidationError as e:
            raise errors.InvalidSchema(_first_error(e)) from None

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def digest(self) -> str:
        """sha1 of the canonical JSON; every publish carries it so the server can refuse a stale schema."""
        return hashlib.sha1(self.canonical_json().encode()).hexdigest()

    def difference(self, other: "Schema") -> tuple[str | None, str] | None:
        """The first difference from ``other`` (the registered schema), as (key, description)."""
        for name in sorted(set(self.keys) | set(other.keys)):
            mine, theirs = self.keys.get(name), other.keys.get(name)
            if mine == theirs:
                continue
            if theirs is None:
                return name, "not in the registered schema"
            if mine is None:
                return name, "registered but missing from this client's schema"
            a, b = mine.model_dump(), theirs.model_dump()
            diffs = [
                f"{f}={a.get(f)!r} here, {b.get(f)!r} registered"
                for f in sorted(set(a) | set(b))
                if a.get(f) != b.get(f)
            ]
            return name, "; ".join(diffs)
        return None


# ---------------------------------------------------------------------------------- reports


def plain_numbers(v: Any) -> Any:
    """A report part as numbers numpy can read: a tensor without its autograd graph (its values are
    what is reported; a tensor that requires grad is still a value). Both workers take parts this way."""
    detach = getattr(v, "detach", None)
    return detach() if callable(detach) else v


def _as_float64(v: Any) -> np.ndarray:
    """Numbers (ints, floats, arrays or tensors of them) as float64; strings, bools and objects are refused."""
    try:
        arr = np.asarray(plain_numbers(v))
    except (
        TypeError,
        ValueError,
        RuntimeError,
    ) as e:  # (a tensor on a device numpy cannot read: RuntimeError/TypeError)
        raise ValueError(f"not an array of numbers: {e}") from None
    if arr.dtype.kind not in "iuf":
        raise ValueError(f"expected numbers, got {type(v).__name__} of {arr.dtype}")
    return arr.astype(np.float64, copy=False)


class _Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class BroadcastReport(_Report):
    value: Any

    def vectors(self, name: str, spec: BroadcastSpec) -> list[np.ndarray]:
        return [_checked(name, "value", self.value, spec.shape, nonneg=False)]


class MergeReport(_Report):
    count: Any
    sum: Any
    sumsq: Any = None

    def vectors(self, name: str, spec: MergeSpec) -> list[np.ndarray]:
        if spec.sumsq and self.sumsq is None:
            raise errors.MalformedReport(name, "the key tracks sumsq but the report has none")
        if not spec.sumsq and self.sumsq is not None:
            raise errors.MalformedReport(name, "the key does not track sumsq but the report carries one")
        out = [
            _checked(name, "count", self.count, spec.count_shape, nonneg=True),
            _checked(name, "sum", self.sum, spec.shape, nonneg=False),
        ]
        if spec.sumsq:
            out.append(_checked(name, "sumsq", self.sumsq, spec.shape, nonneg=True))
        return out


Report = Union[BroadcastReport, MergeReport]


def _checked(name: str, part: str, raw: Any, shape: tuple[int, ...], *, nonneg: bool) -> np.ndarray:
    """``raw`` as a fresh float64 array of ``shape``, finite (and non-negative), or a typed error."""
    if type(raw) is np.ndarray and raw.dtype == np.float64:  # the common case, without a conversion
        arr = raw
    else:
        try:
            arr = _as_float64(raw)
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
        idx = _first(~finite)
        raise errors.NonFiniteValue(name, f"{part}{list(idx)} is {arr[idx]}")
    if nonneg and arr.size and float(arr.min()) < 0:
        idx = _first(arr < 0)
        raise errors.NegativeValue(name, f"{part}{list(idx)} is {arr[idx]} (must be >= 0)")
    return np.array(arr, dtype=np.float64, order="C")  # a copy: later edits by the caller change nothing


def _first(mask: np.ndarray) -> tuple[int, ...]:
    """The index of the first True element, as plain ints."""
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape)) if mask.shape else ()


def coerce_report(name: str, spec: BroadcastSpec | MergeSpec, raw: Any) -> Report:
    """A report model for ``spec`` from a model or a mapping (``{"value": ...}`` / ``{"count", "sum"}``)."""
    model = BroadcastReport if isinstance(spec, BroadcastSpec) else MergeReport
    if isinstance(raw, model):
        return raw
    if isinstance(raw, _Report):
        raise errors.MalformedReport(name, f"a {spec.semantics} key needs a {model.__name__}, got {type(raw).__name__}")
    if not isinstance(raw, Mapping):
        raise errors.MalformedReport(name, f"expected a mapping or {model.__name__}, got {type(raw).__name__}")
    try:
        return model(**raw)
    except ValidationError as e:
        raise errors.MalformedReport(name, _first_error(e)) from None
    except TypeError as e:  # non-string mapping keys
        raise errors.MalformedReport(name, str(e)) from None


_LAYOUTS: dict[int, tuple[Any, tuple[int, tuple[tuple[str, tuple[int, ...], int, bool], ...]]]] = {}


def _layout(spec: BroadcastSpec | MergeSpec) -> tuple[int, tuple[tuple[str, tuple[int, ...], int, bool], ...]]:
    """``(width, ((part, shape, size, non-negative), ...))`` of a key's payload, worked out once per spec
    (the spec is kept beside it, so an id reused by another spec is not mistaken for it)."""
    entry = _LAYOUTS.get(id(spec))
    if entry is None or entry[0] is not spec:
        if isinstance(spec, BroadcastSpec):
            parts: tuple[tuple[str, tuple[int, ...], int, bool], ...] = (("value", spec.shape, spec.size, False),)
        else:
            parts = tuple(
                (part, spec.count_shape if part == "count" else spec.shape,
                 spec.count_size if part == "count" else spec.size, part != "sum")
                for part in spec.parts
            )  # fmt: skip
        entry = _LAYOUTS[id(spec)] = (spec, (spec.width, parts))
    return entry[1]


_F64 = struct.Struct("<d")
_LE_F64 = np.dtype("<f8")
_MIN, _VDOT = np.minimum.reduce, np.vdot


def _plain_payload(spec: BroadcastSpec | MergeSpec, raw: Any) -> bytes | None:
    """The payload bytes of a report in the form the terms publish (a dict of little-endian float64
    arrays of the key's shape and a float count), checked by the sum of their squares (finite only if
    every value is; values beyond 1e154 overflow it and take the models' way) and the signs: a few
    microseconds, where a model per report costs tens. None for any other form, or any value it would
    refuse (the models' way then names the problem)."""
    if type(raw) is not dict:
        return None
    width, parts = _layout(spec)
    if len(raw) != len(parts):
        return None
    pieces, total = [], 0.0
    for part, shape, size, non_negative in parts:
        v = raw.get(part)
        if type(v) is np.ndarray and v.dtype == _LE_F64 and v.shape == shape:
            if non_negative and size and _MIN(v, None) < 0:  # (the ufunc's own: .min() wraps it in Python)
                return None
            total += _VDOT(v, v)  # (flattened; a third of a reduction's time)
            pieces.append(v.tobytes())
        elif part == "count" and shape == () and type(v) in (float, int) and 0 <= v < 1e308:
            total += v
            pieces.append(_F64.pack(v))
        else:
            return None
    return b"".join(pieces) if math.isfinite(total) else None


def encode_reports(
    schema: Schema, reports: Mapping[str, Any], limits: Limits, shard: int | None = None
) -> dict[str, bytes]:
    """Check a whole shard report against the schema; returns per key its payload (float64 LE bytes).

    With ``shard``, a broadcast key owned by another shard is refused too. Raises a typed
    :class:`~redisync.errors.InvalidReport` naming the first bad key.
    """
    if not (type(reports) is dict or isinstance(reports, Mapping)) or not reports:
        raise errors.MalformedReport(None, "a report must be a non-empty mapping of key name to report")
    out: dict[str, bytes] = {}
    total = 0
    for name, raw in reports.items():
        if not isinstance(name, str):
            raise errors.MalformedReport(None, f"key names must be str, got {type(name).__name__}")
        spec = schema.keys.get(name)
        if spec is None:
            raise errors.UnknownKey(name, "not declared in the run's schema")
        owner = spec.owner if isinstance(spec, BroadcastSpec) else None
        if shard is not None and owner is not None and owner != shard:
            raise errors.NotOwner(name, f"owned by shard {owner}; this is shard {shard} (refused before sending)")
        payload = _plain_payload(spec, raw)
        if payload is None:  # anything else, and every error, takes the models' way, which names it
            vectors = coerce_report(name, spec, raw).vectors(name, spec)
            payload = b"".join(np.ascontiguousarray(v, dtype=_LE_F64).tobytes() for v in vectors)
        total += len(payload)
        if total > limits.max_report_bytes:
            raise errors.PayloadTooLarge(name, f"report exceeds max_report_bytes={limits.max_report_bytes}")
        out[name] = payload
    return out


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    return f"{loc}: {err['msg']}" if loc else err["msg"]
