"""The seam between a stateful training term and the store.

A term (the adaptive frame sampler, a normaliser, a curriculum) declares the keys it syncs,
reports what its shard saw, and applies the fleet state it is handed: `SyncedTerm`'s three methods
are all a term of a user's own needs to join. A term may also have the optional capabilities
declared below (`CAPABILITIES`), each a protocol of its own that the syncers look for by
``isinstance``, never by a name spelled in their code.

With the process worker a term may also keep its state in shared memory, which takes the report
and the fleet state off the collector's hot path (`redisync.collector.shared_state`):

- ``share_report(shared) -> bool``: move the buffers the reports are made of into
  ``shared.array(...)``, declare the parts with ``shared.report(key, ...)``, and bracket every
  write to them with ``shared.begin()`` / ``shared.end()``. The sidecar then reads them itself and
  ``report_shard_state`` is no longer called by the process worker.
- ``share_fleet(shared) -> bool``: read the fleet's part from ``shared.receive(key, part)``, which
  the reset boundary updates in place, and notice a new ``shared.applied`` version when reading.
  ``apply_shard_state`` is then no longer called by the process worker.

Either returns False when the term cannot (a CUDA buffer, a report that is not a slice of its
state); the term then stays on the copy path.

A term whose state lives on a CUDA device reports without waiting for the device: its hot-path
report is the newest copy that has landed, up to a publish interval old
(`redisync.terms.torch.device`). It also has ``settle() -> reports``, its current report,
which the syncers call instead where waiting is right: a flush, a stop; and ``device_copies() ->
{name: count}``, what its copies left undone because the device was behind (reports not started,
fleet states deferred), which ``metrics()`` sums over the terms; and ``prepare()``, which the
syncer's ``start()`` calls so that such a term makes its pinned buffers then, not on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import InvalidSchema
from ..store.codec import PullResult
from ..store.schema import KeySpec, Schema

if TYPE_CHECKING:
    from .shared_state import SharedState


@runtime_checkable
class SyncedTerm(Protocol):
    """What the Syncer calls on a term: its keys, its report, the fleet state (see the module)."""

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (empty when the term does not sync)."""

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's reports, ``{key: {"count": ..., "sum": ...}}`` or ``{key: {"value": ...}}``.

        Called on the collector's own thread; the values must be copies the term will not mutate.
        """

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state (every key, as last pulled); local work only, no network."""


Reports = Mapping[str, Mapping[str, Any]]


@runtime_checkable
class Prepares(Protocol):
    """Makes what it needs before the hot path (a device term: its pinned buffers); the Syncer's
    ``start()`` calls it."""

    def prepare(self) -> None:
        """Make the buffers the hot path will use."""


@runtime_checkable
class Settles(Protocol):
    """Its hot-path report may lag a publish (its state on a device); ``settle()`` is its current
    report, which a flush and a stop take instead (never the hot path)."""

    def settle(self) -> Reports:
        """The current report, waiting for the device."""


@runtime_checkable
class CountsDeviceCopies(Protocol):
    """What its device copies left undone because the device was behind (``device_reports_skipped``,
    ``device_fleet_deferred``), summed over the terms by the Syncer's ``metrics()``."""

    def device_copies(self) -> Mapping[str, int]:
        """The device copies left undone so far, by name."""


@runtime_checkable
class SharesReport(Protocol):
    """Moves the buffers its reports are made of into shared memory (the process worker's sidecar then
    reads them itself); False when it cannot (a CUDA buffer)."""

    def share_report(self, shared: SharedState) -> bool:
        """Move the report's buffers into ``shared``; whether it did."""


@runtime_checkable
class SharesFleet(Protocol):
    """Reads the fleet's part from shared memory the reset boundary updates in place; False when it cannot."""

    def share_fleet(self, shared: SharedState) -> bool:
        """Read the fleet's part from ``shared`` from now on; whether it will."""


@runtime_checkable
class HasMetrics(Protocol):
    """Its own figures, logged by the Syncer's ``metrics()`` under ``redisync/<key>/``."""

    key: str

    def metrics(self) -> Mapping[str, float]:
        """Its figures by name."""


@runtime_checkable
class Resumes(Protocol):
    """Whether it was loaded from a checkpoint of this shard (its keys then take the shard's previous
    slot over instead of retiring it)."""

    resumed: bool


CAPABILITIES = (Prepares, Settles, CountsDeviceCopies, SharesReport, SharesFleet, HasMetrics, Resumes)


def schema_of(terms: Iterable[SyncedTerm]) -> Schema:
    """The run schema of several terms; two terms may not claim the same key."""
    keys: dict[str, Any] = {}
    for term in terms:
        for name, spec in term.schema_entries().items():
            if name in keys:
                raise InvalidSchema(f"key {name!r} is declared by two terms")
            keys[name] = spec
    return Schema.of(keys)
