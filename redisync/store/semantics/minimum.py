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

from typing import ClassVar, Literal

from .base import ReportBase, build
from .extremum import ExtremumReport, ExtremumSpec


class MinimumReport(ExtremumReport):
    """A minimum key's report: ``{"value": ...}``."""


class MinimumSpec(ExtremumSpec):
    """Shrink-only register: the element-wise minimum of every value any shard reported in the run."""

    semantics: Literal["minimum"] = "minimum"

    report_model: ClassVar[type[ReportBase]] = MinimumReport
    grows: ClassVar[bool] = False


def minimum(shape: int | tuple[int, ...]) -> MinimumSpec:
    """A shrink-only key any shard may lower (the tightest bound any shard has seen): the fleet value
    is the element-wise minimum of every value reported in the run.

    Args:
        shape: the value's shape (``()`` for a scalar).
    """
    return build(MinimumSpec, shape=shape)


SPEC = MinimumSpec  # the registry's entry (see __init__)
