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

from typing import ClassVar, Literal

from .base import ReportBase, build
from .extremum import ExtremumReport, ExtremumSpec


class MaximumReport(ExtremumReport):
    """A maximum key's report: ``{"value": ...}``."""


class MaximumSpec(ExtremumSpec):
    """Grow-only register: the element-wise maximum of every value any shard reported in the run."""

    semantics: Literal["maximum"] = "maximum"

    report_model: ClassVar[type[ReportBase]] = MaximumReport
    grows: ClassVar[bool] = True


def maximum(shape: int | tuple[int, ...]) -> MaximumSpec:
    """A grow-only key any shard may raise (a monotone curriculum level): the fleet value is the
    element-wise maximum of every value reported in the run.

    Args:
        shape: the value's shape (``()`` for a scalar).
    """
    return build(MaximumSpec, shape=shape)


SPEC = MaximumSpec  # the registry's entry (see __init__)
