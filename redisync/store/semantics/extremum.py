"""What ``maximum`` and ``minimum`` share: a register any shard may move one way only.

The fleet value is the element-wise extreme of every value reported: folding is idempotent and
order-free, a value that does not move it keeps the stored one bit for bit (-0.0 against +0.0
included), and the key's version moves only when the value does. Their Lua: ``check_extreme`` and
``apply_extreme`` in ``lua/shared.lua``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .base import Fold, KeyState, Part, ReportBase, SpecBase, Vector


class ExtremumReport(ReportBase):
    """A report of a one-way register: ``{"value": ...}``."""

    value: Any


class ExtremumSpec(SpecBase):
    """A register any shard moves one way: up (``grows``: the maximum) or down (the minimum)."""

    stored_field: ClassVar[str] = "value"
    grows: ClassVar[bool]

    def payload_parts(self) -> tuple[Part, ...]:
        """The parts a report of this key carries: its value."""
        return (("value", self.shape, self.size, False),)

    def check_payload(self, payload: Vector) -> str | None:
        """Every value finite."""
        return None if np.isfinite(payload).all() else "non_finite"

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the element-wise extreme with the key's value."""
        bad = self.check_payload(report.payload)
        if bad:
            return bad
        if state.value is None:
            return KeyState(version=state.version + 1, value=report.payload.copy())
        moves = np.greater(report.payload, state.value) if self.grows else np.less(report.payload, state.value)
        moved = np.where(moves, report.payload, state.value)
        if moved.tobytes() == state.value.tobytes():
            return KeyState(version=state.version, value=state.value.copy())
        return KeyState(version=state.version + 1, value=moved)
