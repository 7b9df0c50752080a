"""The seam between a stateful training term and the store.

A term (the adaptive frame sampler, a normaliser, a curriculum) declares the keys it syncs,
reports what its shard saw, and applies the fleet state it is handed. The `Syncer`
calls these three methods and nothing else, so any term of a user's own can join.

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
from typing import Any, Protocol, runtime_checkable

from ..errors import InvalidSchema
from ..store.codec import PullResult
from ..store.schema import KeySpec, Schema


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


def schema_of(terms: Iterable[SyncedTerm]) -> Schema:
    """The run schema of several terms; two terms may not claim the same key."""
    keys: dict[str, Any] = {}
    for term in terms:
        for name, spec in term.schema_entries().items():
            if name in keys:
                raise InvalidSchema(f"key {name!r} is declared by two terms")
            keys[name] = spec
    return Schema.of(keys)
