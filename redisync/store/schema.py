"""The run schema (its keys' specs, from `.semantics`), its limits, and shard reports checked
and encoded before they are sent.

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
from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import errors
from .semantics import (
    DEFAULT_LEASE_GRACE_S,
    DEFAULT_LEASE_S,
    BroadcastReport,
    BroadcastSpec,
    KeySpec,
    Lifecycle,
    MaximumReport,
    MaximumSpec,
    MergeReport,
    MergeSpec,
    MinimumReport,
    MinimumSpec,
    Report,
)
from .semantics.base import Part, ReportBase, first_error, plain_numbers
from .semantics.broadcast import broadcast
from .semantics.maximum import maximum
from .semantics.merge import merge
from .semantics.minimum import minimum

KEY_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}/[A-Za-z0-9_.-]{1,64}$")
MEASURED_DRIFT_SUFFIX = ".drift_tv"
"""A merge key named ``<key>.drift_tv`` holds, in each shard's slot, the drift that shard measured for
``<key>`` (an observing sampler's distance from the pooled distribution, one value per group): what
`redisync watch` and the exporter show as measured."""

__all__ = [
    "DEFAULT_LEASE_GRACE_S",
    "DEFAULT_LEASE_S",
    "MEASURED_DRIFT_SUFFIX",
    "BroadcastReport",
    "BroadcastSpec",
    "Encoded",
    "KeySpec",
    "Lifecycle",
    "Limits",
    "MaximumReport",
    "MaximumSpec",
    "MergeReport",
    "MergeSpec",
    "MinimumReport",
    "MinimumSpec",
    "Report",
    "Schema",
    "broadcast",
    "coerce_report",
    "encode_reports",
    "maximum",
    "merge",
    "minimum",
    "plain_numbers",
]


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
    # leases run out in the time the server spent serving the run: a gap between two of the run's
    # calls (lease renewals, folds) longer than this counts as this long, so a stall of the server of
    # any length runs out nobody's lease (lua/clock.lua); a live fleet calls every second
    stall_after_s: float = Field(default=2.0, gt=0, le=3600)
    # at most one announcement of the run's new versions per this many seconds (0: one per fold): every
    # fold announced to every follower costs the server folds x followers messages, which grows as the
    # square of the fleet; coalesced, the last version of a burst is still announced, once the window
    # has passed (by the client whose fold opened the debt: `Store.announce_owed`)
    announce_every_s: float = Field(default=0.0, ge=0, le=10)

    @property
    def announce_every_us(self) -> int:
        """``announce_every_s`` in microseconds, as the run's meta holds it."""
        return round(self.announce_every_s * 1e6)

    def packed(self) -> str:
        """The limits as the fold reads them, one run-meta field (``limits``) instead of six:
        ``max_report_bytes|stream_maxlen|stream_payloads|dead_letter_maxlen|dead_letter_max_bytes|stall_after_us``."""
        return (
            f"{self.max_report_bytes}|{self.stream_maxlen}|{int(self.stream_payloads)}|"
            f"{self.dead_letter_maxlen}|{self.dead_letter_max_bytes}|{self.stall_after_us}"
        )

    @property
    def stall_after_us(self) -> int:
        """``stall_after_s`` in the microseconds the Lua clock counts in."""
        return round(self.stall_after_s * 1e6)

    @classmethod
    def unpacked(cls, text: str) -> Limits:
        """The limits from `packed`'s text (five fields: written before ``stall_after_s``)."""
        parts = text.split("|")
        if len(parts) not in (5, 6) or not all(p.isdigit() for p in parts):
            raise ValueError(f"not packed limits: {text!r}")
        return cls(
            max_report_bytes=int(parts[0]),
            stream_maxlen=int(parts[1]),
            stream_payloads=parts[2] == "1",
            dead_letter_maxlen=int(parts[3]),
            dead_letter_max_bytes=int(parts[4]),
            **({"stall_after_s": int(parts[5]) / 1e6} if len(parts) == 6 else {}),
        )


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
    def of(cls, keys: Mapping[str, Any]) -> Schema:
        """A schema from ``{key: spec}``."""
        try:
            return cls(keys=dict(keys))
        except ValidationError as e:
            raise errors.InvalidSchema(first_error(e)) from None

    def canonical_json(self) -> str:
        """The schema as canonical JSON (its digest is the run's schema digest)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    @functools.cached_property
    def digest(self) -> str:
        """sha1 of the canonical JSON; every publish carries it so the server can refuse a stale schema."""
        return hashlib.sha1(self.canonical_json().encode()).hexdigest()

    def difference(self, other: Schema) -> tuple[str | None, str] | None:
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


def coerce_report(name: str, spec: KeySpec, raw: Any) -> ReportBase:
    """A report model for ``spec`` from a model or a mapping (``{"value": ...}`` / ``{"count", "sum"}``)."""
    return spec.coerce(name, raw)


_LAYOUTS: dict[int, tuple[Any, tuple[int, tuple[Part, ...]]]] = {}


def _layout(spec: KeySpec) -> tuple[int, tuple[Part, ...]]:
    """``(width, ((part, shape, size, non-negative), ...))`` of a key's payload, worked out once per spec
    (the spec is kept beside it, so an id reused by another spec is not mistaken for it)."""
    entry = _LAYOUTS.get(id(spec))
    if entry is None or entry[0] is not spec:
        entry = _LAYOUTS[id(spec)] = (spec, (spec.width, spec.payload_parts()))
    return entry[1]


_F64 = struct.Struct("<d")
_LE_F64 = np.dtype("<f8")
_MIN, _VDOT = np.minimum.reduce, np.vdot


def _plain_payload(spec: KeySpec, raw: Any) -> bytes | None:
    """The payload bytes of a report in the form the terms publish (a dict of little-endian float64
    arrays of the key's shape and a float count), checked by the sum of their squares (finite only if
    every value is; values beyond 1e154 overflow it and take the models' way) and the signs: a few
    microseconds, where a model per report costs tens. None for any other form, or any value it would
    refuse (the models' way then names the problem)."""
    if type(raw) is not dict:
        return None
    _width, parts = _layout(spec)
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
        elif part == "count" and shape == () and v is not None and type(v) in (float, int) and 0 <= v < 1e308:
            total += v
            pieces.append(_F64.pack(v))
        else:
            return None
    return b"".join(pieces) if math.isfinite(total) else None


class Encoded(bytes):
    """A key's report as `encode_reports` made its payload (float64 LE bytes): checked once, where it
    was made (a sidecar's collector), it travels as is and is not checked and encoded again."""


def encode_reports(
    schema: Schema, reports: Mapping[str, Any], limits: Limits, shard: int | None = None
) -> dict[str, bytes]:
    """Check a whole shard report against the schema; returns per key its payload (float64 LE bytes).

    With ``shard``, a broadcast key owned by another shard is refused too. Raises a typed
    `InvalidReport` naming the first bad key.
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
        refused = None if shard is None else spec.refuses_writer(shard)
        if refused:
            raise errors.NotOwner(name, f"{refused} (refused before sending)")
        payload: bytes | None
        if type(raw) is Encoded:
            if len(raw) != 8 * spec.width:
                raise errors.ShapeMismatch(
                    name, f"an encoded payload of {len(raw)} bytes, the key needs {8 * spec.width}"
                )
            payload = raw
        else:
            payload = _plain_payload(spec, raw)
        if payload is None:  # anything else, and every error, takes the models' way, which names it
            vectors = coerce_report(name, spec, raw).vectors(name, spec)
            payload = b"".join(np.ascontiguousarray(v, dtype=_LE_F64).tobytes() for v in vectors)
        total += len(payload)
        if total > limits.max_report_bytes:
            raise errors.PayloadTooLarge(name, f"report exceeds max_report_bytes={limits.max_report_bytes}")
        out[name] = payload
    return out
