"""maximum: a grow-only register; the fleet value is the element-wise maximum of every value reported.

For a monotone curriculum level that any shard may raise (a command-range curriculum, a terrain
level that only goes up): no owner, unlike broadcast, and no slots, unlike merge. Folding is
idempotent and order-free: the value after any set of reports is the same in any order, a report
folded twice changes nothing, and a restarted shard that reports a lower value lowers nothing. A
store that lost the run is re-seeded by the collectors' next reports, each at least what it adopted.
The key's version moves only when the value grows (a report that raises nothing is applied, and
leaves the key as it was). Its Lua: ``lua/semantics/maximum.lua``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from .base import Fold, KeyState, Part, ReportBase, SpecBase, Vector, build


class MaximumReport(ReportBase):
    """A maximum key's report: ``{"value": ...}``."""

    value: Any


class MaximumSpec(SpecBase):
    """Grow-only register: the element-wise maximum of every value any shard reported in the run."""

    semantics: Literal["maximum"] = "maximum"

    stored_field: ClassVar[str] = "value"
    report_model: ClassVar[type[ReportBase]] = MaximumReport

    def payload_parts(self) -> tuple[Part, ...]:
        """The parts a report of this key carries: its value."""
        return (("value", self.shape, self.size, False),)

    def check_payload(self, payload: Vector) -> str | None:
        """Check a decoded payload's length against the shape."""
        return None if np.isfinite(payload).all() else "non_finite"

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the element-wise maximum with the key's value."""
        bad = self.check_payload(report.payload)
        if bad:
            return bad
        if state.value is None:
            return KeyState(version=state.version + 1, value=report.payload.copy())
        # a value that is not greater keeps the stored one, bit for bit (-0.0 against +0.0 included)
        grown = np.where(report.payload > state.value, report.payload, state.value)
        if grown.tobytes() == state.value.tobytes():
            return KeyState(version=state.version, value=state.value.copy())
        return KeyState(version=state.version + 1, value=grown)


def maximum(shape: int | tuple[int, ...]) -> MaximumSpec:
    """A grow-only key any shard may raise (a monotone curriculum level): the fleet value is the
    element-wise maximum of every value reported in the run.

    Args:
        shape: the value's shape (``()`` for a scalar).
    """
    return build(MaximumSpec, shape=shape)


SPEC = MaximumSpec  # the registry's entry (see __init__)
