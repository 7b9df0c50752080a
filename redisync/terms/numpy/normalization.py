"""Empirical observation normalisation for numpy environments, synced.

Each shard keeps the cumulative ``count``, ``Σ(x − c)`` and ``Σ(x − c)²`` of what it saw (float64,
shifted by a fixed ``offset`` c where cancellation matters) and reports them to a ``merge`` key
(the ``history`` lifecycle: a restart's previous life stays counted). ``mean`` and ``std`` — arrays
the caller may own, written in place for a kernel that reads them — hold the moments of the
fleet's statistics as last pulled plus the shard's own up to now (``pooled``), or of the shard's
own (``local``, and ``observe``, which reports and reads as ``pooled`` does but normalises with its
own statistics, measuring how far they are from the fleet's: `metrics`). The moments come from
`redisync.terms.formulas.moments`, as the torch term's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import numpy as np
from numpy.typing import NDArray

from ...errors import InvalidSchema
from ...store.codec import PullResult
from ...store.schema import MergeSpec, merge
from .. import formulas
from ..role import Role, role_of
from .sampler import _caller_array

Mode = Literal["local", "pooled", "observe"]
MODES: tuple[str, ...] = get_args(Mode)


class EmpiricalNormalizer:
    """``(x − mean) / (std + eps)`` with the mean and std of every sample the fleet saw (``pooled``)."""

    def __init__(
        self,
        shape: int | tuple[int, ...],
        eps: float = 1e-2,
        *,
        mode: Mode = "pooled",
        key: str = "obs/norm",
        until: int | None = None,
        offset: float | NDArray[Any] = 0.0,
        dtype: Any = np.float32,
        mean: NDArray[Any] | None = None,
        std: NDArray[Any] | None = None,
    ):
        if mode not in MODES:
            raise InvalidSchema(f"numpy normaliser mode must be one of {MODES}, got {mode!r}")
        self.shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        self.eps, self.mode, self.key, self.until = eps, mode, key, until
        self.role = role_of(mode, leads=True)
        dtype = np.dtype(dtype if mean is None else mean.dtype)
        self.mean = _caller_array(mean, self.shape, dtype, "mean")
        self.std = _caller_array(std, self.shape, dtype, "std")
        if std is None:
            self.std[...] = 1
        self.offset = np.broadcast_to(np.asarray(offset, dtype=np.float64), self.shape).copy()
        self.own = np.zeros((3, *self.shape))  # count, Σ(x − c), Σ(x − c)²
        self.others = np.zeros((3, *self.shape))
        self.fleet_version = 0

    @property
    def count(self) -> int:
        """The samples behind ``mean`` and ``std``."""
        own: NDArray[Any] = self.own
        return round(float((self.others + own)[0].flat[0])) if self.role is Role.POOLS else int(own[0].flat[0])

    def normalize(self, x: NDArray[Any]) -> NDArray[Any]:
        """Normalise ``x`` with the statistics held (the fleet's, when pooled)."""
        out: NDArray[Any] = (x - self.mean) / (self.std + self.eps)
        return out

    def update(self, x: NDArray[Any]) -> None:
        """Learn from a batch (rows are samples)."""
        if self.until is not None and self.own[0].flat[0] >= self.until:
            return
        shifted = np.asarray(x, dtype=np.float64).reshape(-1, *self.shape) - self.offset
        self.own[0] += shifted.shape[0]
        self.own[1] += shifted.sum(axis=0)
        self.own[2] += (shifted * shifted).sum(axis=0)
        self._set()

    def _set(self) -> None:
        n, s, q = self.others + self.own if self.role is Role.POOLS else self.own
        if float(n.flat[0]) <= 0:
            return
        mean, var = formulas.moments(n, s, q, formulas.NUMPY)
        big = np.finfo(self.mean.dtype).max
        np.copyto(self.mean, np.clip(mean + self.offset, -big, big), casting="unsafe")
        np.copyto(self.std, np.sqrt(np.clip(var, 0, big)), casting="unsafe")

    # ------------------------------------------------------------------ the seam

    def schema_entries(self) -> Mapping[str, MergeSpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        return {self.key: merge(self.shape, sumsq=True, lifecycle="history")} if self.role.pools else {}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if not self.role.pools:
            return {}
        return {self.key: {"count": float(self.own[0].flat[0]), "sum": self.own[1].copy(), "sumsq": self.own[2].copy()}}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None or not self.role.pools:
            return
        others = view.others_parts()
        self.others[0] = np.broadcast_to(others["count"], self.shape)
        self.others[1], self.others[2] = others["sum"], others["sumsq"]
        self.fleet_version = fleet.fleet_version
        self._set()

    def metrics(self) -> dict[str, float]:
        """Where it pools or observes, once a fleet state arrived: ``drift_offset_sd``, the largest
        offset of the shard's own mean from the fleet's (its own statistics and the others' as last
        pulled), in the fleet's standard deviations - what ``redisync inspect`` shows of a moments
        key; an observing shard normalises with its own mean, so this is how far its inputs are off."""
        if not self.role.pools or self.fleet_version == 0 or float(self.own[0].flat[0]) <= 0:
            return {}
        pooled = self.others + self.own
        own_mean, _ = formulas.moments(self.own[0], self.own[1], self.own[2], formulas.NUMPY)
        fleet_mean, fleet_var = formulas.moments(pooled[0], pooled[1], pooled[2], formulas.NUMPY)
        offset = np.abs(own_mean - fleet_mean) / np.maximum(np.sqrt(fleet_var), 1e-12)
        return {"drift_offset_sd": float(offset.max())}
