"""The semantics a key may have, one module each, and the one place that lists them.

- `.broadcast`: last writer wins (an owner's value for everyone);
- `.merge`: the exact sum of every shard's live slot (pooled statistics);
- `.maximum`: the element-wise maximum of everything reported (a level any shard may raise);
- `.minimum`: the element-wise minimum (a level any shard may lower).

``NAMES`` is the registry: one entry per semantics, each a module here (whose ``SPEC`` is its key
spec's class) and a Lua module ``lua/semantics/<name>.lua`` (the library takes its list from here).
``KeySpec`` is the type of any key's spec (a pydantic union told apart by its ``semantics`` field,
made from the registry); code outside the semantics' modules asks the spec (`.base.SpecBase`'s
methods) and never tells one class from another, so a new semantics is its two modules and its name
here. The builders (``broadcast()``, ``merge()``, ``maximum()``, ``minimum()``) are in their modules and in
`redisync.store.schema`.
"""

from __future__ import annotations

import functools
import importlib
import operator
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from .base import ReportBase, SpecBase
from .broadcast import BroadcastReport, BroadcastSpec
from .maximum import MaximumReport, MaximumSpec
from .merge import DEFAULT_LEASE_GRACE_S, DEFAULT_LEASE_S, Lifecycle, MergeReport, MergeSpec
from .minimum import MinimumReport, MinimumSpec

# the registry: one name per semantics
NAMES = ("broadcast", "merge", "maximum", "minimum")

SEMANTICS: dict[str, type[SpecBase]] = {name: importlib.import_module(f"{__name__}.{name}").SPEC for name in NAMES}
if TYPE_CHECKING:  # (a union made at run time is no static type: code asks a spec through SpecBase)
    KeySpec = SpecBase
    Report = ReportBase
else:
    KeySpec = Annotated[functools.reduce(operator.or_, SEMANTICS.values()), Field(discriminator="semantics")]
    Report = functools.reduce(operator.or_, (spec.report_model for spec in SEMANTICS.values()))

__all__ = [
    "DEFAULT_LEASE_GRACE_S",
    "DEFAULT_LEASE_S",
    "NAMES",
    "SEMANTICS",
    "BroadcastReport",
    "BroadcastSpec",
    "KeySpec",
    "Lifecycle",
    "MaximumReport",
    "MaximumSpec",
    "MergeReport",
    "MergeSpec",
    "MinimumReport",
    "MinimumSpec",
    "Report",
]
