"""minimum: a shrink-only register; the fleet value is the element-wise minimum of every value reported.

For the tightest bound any shard has seen (a safety limit: the lowest joint-torque margin before a
fall, the smallest contact clearance) that every collector should respect at once: no owner, unlike
broadcast, and no slots, unlike merge. Folding is idempotent and order-free: the value after any set
of reports is the same in any order, a report folded twice changes nothing, and a restarted shard
that reports a higher value raises nothing. A store that lost the run is re-seeded by the collectors'
next reports, each at most what it adopted. The key's version moves only when the value shrinks (a
report that lowers nothing is applied, and leaves the key as it was). Its Lua:
``lua/semantics/minimum.lua``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np

from .base import Fold, KeyState, Part, ReportBase, SpecBase, Vector, build


class MinimumReport(ReportBase):
    """A minimum key's report: ``{"value": ...}``."""

    value: Any


class MinimumSpec(SpecBase):
    """Shrink-only register: the element-wise minimum of every value any shard reported in the run."""

    semantics: Literal["minimum"] = "minimum"

    stored_field: ClassVar[str] = "value"
    report_model: ClassVar[type[ReportBase]] = MinimumReport

    def payload_parts(self) -> tuple[Part, ...]:
        """The parts a report of this key carries: its value."""
        return (("value", self.shape, self.size, False),)

    def check_payload(self, payload: Vector) -> str | None:
        """Every value finite."""
        return None if np.isfinite(payload).all() else "non_finite"

    def fold(self, state: KeyState, report: Fold) -> KeyState | str:
        """The reference fold of one report: the element-wise minimum with the key's value."""
        bad = self.check_payload(report.payload)
        if bad:
            return bad
        if state.value is None:
            return KeyState(version=state.version + 1, value=report.payload.copy())
        # a value that is not smaller keeps the stored one, bit for bit (-0.0 against +0.0 included)
        shrunk = np.where(report.payload < state.value, report.payload, state.value)
        if shrunk.tobytes() == state.value.tobytes():
            return KeyState(version=state.version, value=state.value.copy())
        return KeyState(version=state.version + 1, value=shrunk)


def minimum(shape: int | tuple[int, ...]) -> MinimumSpec:
    """A shrink-only key any shard may lower (the tightest bound any shard has seen): the fleet value
    is the element-wise minimum of every value reported in the run.

    Args:
        shape: the value's shape (``()`` for a scalar).
    """
    return build(MinimumSpec, shape=shape)


SPEC = MinimumSpec  # the registry's entry (see __init__)
