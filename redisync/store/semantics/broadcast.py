"""broadcast: a last-writer-wins register; with an owner, only that shard may write it.

For a value one process decides and every collector adopts (a penalty scale, a curriculum stage, a
normaliser the learner owns). Its Lua: ``lua/semantics/broadcast.lua``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from .base import Fold, KeyState, Part, ReportBase, SpecBase, Vector, build


class BroadcastReport(ReportBase):
    """A broadcast key's report: ``{"value": ...}``."""

    value: Any


class BroadcastSpec(SpecBase):
    """Last-writer-wins register; with ``owner``, only that shard may write."""

    semantics: Literal["broadcast"] = "broadcast"
    owner: int | None = Field(default=None, ge=0)

    stored_field: ClassVar[str] = "value"
    report_model: ClassVar[type[ReportBase]] = BroadcastReport

    def payload_parts(self) -> tuple[Part, ...]:
        """The parts a report of this key carries: its value."""
        return (("value", self.shape, self.size, False),)

    def refuses_writer(self, shard_id: int) -> str | None:
        """Why ``shard`` may not write this key (not its owner), or None."""
        if self.owner in (None, shard_id):
            return None
        return f"owned by shard {self.owner}; this is shard {shard_id}"

    def register_fields(self) -> dict[str, str]:
        """The key's metadata fields, as the fold reads them."""
        return super().register_fields() | {"owner": "" if self.owner is None else str(self.owner)}

    def check_payload(self, payload: Vector) -> str | None:
        """Check a decoded payload's length against the shape."""
        return None if np.isfinite(payload).all() else "non_finite"

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the value replaces the key's."""
        if self.refuses_writer(report.shard_id):
            return "not_owner"
        bad = self.check_payload(report.payload)
        if bad:
            return bad
        return KeyState(version=state.version + 1, value=report.payload.copy(), writer=report.shard_id)

    def describe(self, meta: Mapping[str, str], read: Callable[[list[str]], list[Any]], now_us: int) -> dict[str, Any]:
        """Its owner and last writer."""
        return {"owner": self.owner, "writer": meta.get("writer")}


def broadcast(shape: int | tuple[int, ...], owner: int | None = None) -> BroadcastSpec:
    """A last-writer-wins key (penalty scale, curriculum stage, a learner-owned normaliser).

    Args:
        shape: the value's shape (``()`` for a scalar).
        owner: the one shard that may write it (holosoma's rank 0); ``None``: any shard.
    """
    return build(BroadcastSpec, shape=shape, owner=owner)


SPEC = BroadcastSpec  # the registry's entry (see __init__)
