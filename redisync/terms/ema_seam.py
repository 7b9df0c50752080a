"""The seam of a failure-EMA term, once for the torch and the numpy sampler: by role
(`redisync.terms.role`), the key it declares, the report it makes and the fleet part it reads.

- ``local``: nothing synced;
- ``pooled``: each shard's own EMA is a slot (count 1) of a ``merge`` key; the shard samples from the
  others' sum plus its own EMA of now;
- ``weighted``: each report carries the failures since the last one as its count, and the
  shard blends the failure-weighted mean of the shards' EMAs into its own;
- ``broadcast``: the owner shard's EMA is everybody's;
- ``observe``: reported and read as ``pooled`` is, but the shard samples from its own EMA: the
  distance between its distribution and the pooled one is measured, not applied, and reported too
  (``<key>.drift_tv``, one value per group, for `redisync watch` and the exporter).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..store.codec import KeyView
from ..store.schema import DEFAULT_LEASE_GRACE_S, MEASURED_DRIFT_SUFFIX, KeySpec, Lifecycle, broadcast, merge
from .role import Role


def declared(
    role: Role,
    key: str,
    shape: int | tuple[int, ...],
    *,
    owner: int,
    stale_after_s: float | None,
    lifecycle: Lifecycle,
    lease_grace_s: float | None = DEFAULT_LEASE_GRACE_S,
    groups: int = 1,
) -> dict[str, KeySpec]:
    """The key a sampler of ``role`` syncs (none when alone). An EMA is a current state (``state``,
    the samplers' default): a fresh restart drops the previous life's slot, a resume takes it over.
    A stale slot drops out of ``pooled`` only (``weighted``'s counts are the failures behind a report)."""
    if role.semantics is None:
        return {}
    if role.broadcasts:
        return {key: broadcast(shape, owner=owner)}
    stale = stale_after_s if role.pools else None
    keys: dict[str, KeySpec] = {
        key: merge(shape, stale_after_s=stale, lifecycle=lifecycle, lease_grace_s=lease_grace_s)
    }
    if role is Role.OBSERVES:  # each shard's measured drift: a current state, like the EMA it measures
        keys[key + MEASURED_DRIFT_SUFFIX] = merge(groups, stale_after_s=stale, lifecycle="state",
                                                  lease_grace_s=lease_grace_s)  # fmt: skip
    return keys


def report(
    role: Role, key: str, own: NDArray[np.float64], *, count: float = 1.0, drift: NDArray[np.float64] | None = None
) -> Mapping[str, Mapping[str, Any]]:
    """This shard's report of its own EMA ``own`` (a float64 copy): ``count`` is 1 when pooled, the
    failures behind it when weighted; only the owner reports a broadcast; an observing shard adds its
    measured ``drift`` (per group) once it has one."""
    if role.pools:
        if role is Role.OBSERVES and drift is not None:
            return {key: {"count": 1.0, "sum": own}, key + MEASURED_DRIFT_SUFFIX: {"count": 1.0, "sum": drift}}
        return {key: {"count": 1.0, "sum": own}}
    if role is Role.WEIGHS:
        return {key: {"count": count, "sum": count * own}}
    if role is Role.LEADS:
        return {key: {"value": own}}
    return {}


def follows_fleet(role: Role) -> bool:
    """Whether the EMA the shard samples from holds a fleet part (pooled, or a broadcast's receiver;
    a weighted shard blends the fleet into its own EMA instead)."""
    return role in (Role.POOLS, Role.FOLLOWS)


def fleet_part(role: Role, view: KeyView) -> NDArray[np.float64]:
    """The fleet part a sampler adds (pooled: the others' summed EMAs), measures against (observe:
    the same) or takes (broadcast: the owner's)."""
    part = view.others_parts()["sum"] if role.pools else view.parts()["value"]
    return np.asarray(part, dtype=np.float64)
