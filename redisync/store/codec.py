"""Arrays to bytes and script replies to typed results.

Vectors travel and rest as little-endian float64 bytes, the only encoding that is exact and
that the Lua ``struct`` library decodes without per-element parsing.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .. import errors
from .schema import Schema
from .semantics import KeySpec
from .semantics.base import Vector

LE_F64 = np.dtype("<f8")


def epoch_tag(epoch: str) -> int:
    """31 bits naming an epoch, to keep beside a version in one int64 (a sidecar's successor
    compares epochs by tag: see ``ShardClient.continue_from``)."""
    return zlib.crc32(epoch.encode()) & 0x7FFFFFFF


def encode(vectors: Sequence[Vector]) -> bytes:
    """One payload from float64 arrays, laid end to end."""
    return b"".join(np.ascontiguousarray(v, dtype=LE_F64).tobytes() for v in vectors)


def as_text(v: Any) -> str:
    """A reply's bytes as text (invalid UTF-8 shown as backslash escapes, never an error): the one
    helper every module that reads Redis replies uses."""
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


def decode(raw: bytes, width: int | None = None) -> Vector:
    """A writable float64 vector from payload bytes; checks the length when ``width`` is given."""
    if width is not None and len(raw) != 8 * width:
        raise errors.ShapeMismatch(None, f"expected {8 * width} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=LE_F64).astype(np.float64)


@dataclass(frozen=True)
class PublishResult:
    """What the fold did: ``applied`` (with the new versions) or ``duplicate`` (already folded)."""

    status: Literal["applied", "duplicate"]
    fleet_version: int
    key_versions: dict[str, int] = field(default_factory=dict)
    server_time_us: int | None = None
    epoch: str | None = None  # the run's epoch after the fold (a new one after a server restart)
    owed_in_us: int | None = None  # the fold left its announcement owed: pay it this much later

    @property
    def applied(self) -> bool:
        """Whether the fold applied the report (not a duplicate)."""
        return self.status == "applied"


def parse_publish(reply: Sequence[Any], names: Sequence[str]) -> PublishResult:
    """The typed result of ``fold.lua``; a rejection raises its typed error."""
    status = reply[0]
    if status == b"applied" or status == "applied":
        versions = {names[0]: int(reply[4])} if len(names) == 1 else dict(zip(names, map(int, reply[4:]), strict=False))
        epoch = reply[3]
        owed = reply[4 + len(names)] if len(reply) > 4 + len(names) else b""
        return PublishResult(
            "applied",
            int(reply[1]),
            versions,
            int(reply[2]),
            epoch.decode() if type(epoch) is bytes else str(epoch),
            int(owed) if owed else None,
        )
    status = as_text(status)
    if status == "duplicate":
        return PublishResult("duplicate", int(reply[1]))
    if status == "rejected":
        reason, key, detail = (as_text(x) for x in reply[1:4])
        if reason == "no_run":
            raise errors.RunNotFound(detail)
        raise errors.rejection(reason, key, detail)
    raise errors.RedisyncError(f"unexpected reply from the fold script: {reply!r}")


@dataclass(frozen=True)
class KeyView:
    """One key of the fleet state as pulled: its version, fleet value and (merge) the caller's slot."""

    name: str
    spec: KeySpec
    version: int
    value: Vector | None  # flat: broadcast value, or merge aggregate count||sum[||sumsq]; None if unwritten
    own_slot: Vector | None = None  # the caller's slot as folded (merge), for own substitution
    own_incarnation: int | None = None

    def parts_of(self, flat: Vector) -> dict[str, Vector]:
        """A flat vector of this key in its parts (merge: ``count``, ``sum``, ``sumsq``; else ``value``)."""
        return self.spec.parts_of(flat)

    def parts(self) -> dict[str, Vector]:
        """The fleet value in parts (empty when never written)."""
        return {} if self.value is None else self.parts_of(self.value)

    def others_parts(self) -> dict[str, Vector]:
        """Merge: everybody else's aggregate — the fleet value without the caller's slot — in parts
        (empty when never written). A term adds its own current state to it: own substitution."""
        others = self.others()
        return {} if others is None else self.parts_of(others)

    def others(self) -> Vector | None:
        """What the rest of the fleet holds, flat (merge: without the caller's slot); None when never written."""
        return self.spec.others(self.value, self.own_slot)

    def moments(self) -> tuple[Vector, Vector | None]:
        """Merge: the fleet ``(mean, var)`` (var is None without sumsq)."""
        return self.spec.moments(self.name, self.parts())

    def view(self, own_current: Mapping[str, Any]) -> dict[str, Vector]:
        """The fleet value this collector acts on, in parts. Merge: own substitution, everybody else's
        data as pulled plus ours as of now (``own_current``: this shard's report of now,
        ``{"count": ..., "sum": ...}``). Other keys: the fleet value."""
        return self.spec.view(self.name, self.value, self.own_slot, own_current)


@dataclass(frozen=True)
class PullResult:
    """A changed fleet state: the epoch, the fleet version and every key that changed since the caller's pull."""

    epoch: str
    fleet_version: int
    epoch_changed: bool
    keys: dict[str, KeyView]
    server_time_us: int
    lost_writes: bool = False  # same epoch but older than a version already seen: re-publish


def version_reply(known: PullResult) -> list[bytes]:
    """What ``HMGET meta epoch fleet_version`` returns while the run is still at ``known``."""
    return [known.epoch.encode(), str(known.fleet_version).encode()]


def parse_pull(
    reply: Any,
    schema: Schema,
    known_epoch: str | None,
    incarnation: int | None = None,
    resumed: Callable[[str], bool] = lambda name: False,
) -> PullResult | None:
    """The typed result of ``pull.lua``: None when nothing changed.

    The caller's slot is its own when it belongs to ``incarnation``, and also when it is a previous
    life's slot that the caller's next fold removes from the aggregate: one it takes over (a key it
    ``resumed``) or drops (a ``state`` key). A previous life's slot of a ``history`` key stays in the
    aggregate as retired history, so it is not the caller's own.
    """
    if reply is None:
        return None
    status = as_text(reply[0])
    if status == "no_run":
        raise errors.RunNotFound("the run is not registered (or the store lost it); register it again")
    if status == "corrupt_state":
        raise errors.rejection("corrupt_state", as_text(reply[1]), as_text(reply[2]))
    if status != "changed":
        raise errors.RedisyncError(f"unexpected reply from the pull script: {reply!r}")
    epoch, fleet_version, now = as_text(reply[1]), int(reply[2]), int(as_text(reply[3]))
    names = list(schema.keys)
    keys: dict[str, KeyView] = {}
    rest = reply[4:]
    for i in range(0, len(rest), 5):
        index, version, value, own, own_inc = rest[i : i + 5]
        name = names[int(index) - 1]
        spec = schema.keys[name]
        previous_life = own_inc and incarnation is not None and int(own_inc) != incarnation
        if previous_life and not (resumed(name) or spec.keeps_slot_across_lives()):
            own, own_inc = b"", b""
        keys[name] = KeyView(
            name=name,
            spec=spec,
            version=int(version),
            value=decode(value, spec.width) if value else None,
            own_slot=decode(own, spec.width) if own else None,
            own_incarnation=int(own_inc) if own_inc else None,
        )
    return PullResult(epoch, fleet_version, epoch != known_epoch, keys, now)
