"""The semantics a key may have, one module each, and the one place that lists them.

- `.broadcast`: last writer wins (an owner's value for everyone);
- `.merge`: the exact sum of every shard's live slot (pooled statistics);
- `.maximum`: the element-wise maximum of everything reported (a level any shard may raise).

``KeySpec`` is the type of any key's spec (a pydantic union told apart by its ``semantics`` field);
code that needs a semantics' behaviour calls the spec's methods (`.base.SpecBase`), and code
that must tell them apart matches on the spec classes with ``assert_never`` in its last case, so a
new semantics is a type error wherever it is not handled. The library's Lua takes its list of
semantics' modules (``lua/semantics/<name>.lua``) from ``SEMANTICS`` (`redisync.store.library`).
The builders (``broadcast()``, ``merge()``, ``maximum()``) are in their modules and in
`redisync.store.schema`; here the names are the modules'.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .base import SpecBase
from .broadcast import BroadcastReport, BroadcastSpec
from .maximum import MaximumReport, MaximumSpec
from .merge import DEFAULT_LEASE_GRACE_S, Lifecycle, MergeReport, MergeSpec

KeySpec = Annotated[BroadcastSpec | MergeSpec | MaximumSpec, Field(discriminator="semantics")]
Report = BroadcastReport | MergeReport | MaximumReport
SEMANTICS: dict[str, type[SpecBase]] = {"broadcast": BroadcastSpec, "merge": MergeSpec, "maximum": MaximumSpec}
# every part a report of any semantics may carry, each once (from the report models: a new semantics'
# parts travel through the sidecar's mailbox with nothing else to change)
REPORT_PARTS: tuple[str, ...] = tuple(
    dict.fromkeys(part for model in (BroadcastReport, MergeReport, MaximumReport) for part in model.model_fields)
)

__all__ = [
    "DEFAULT_LEASE_GRACE_S",
    "REPORT_PARTS",
    "SEMANTICS",
    "BroadcastReport",
    "BroadcastSpec",
    "KeySpec",
    "Lifecycle",
    "MaximumReport",
    "MaximumSpec",
    "MergeReport",
    "MergeSpec",
    "Report",
]
