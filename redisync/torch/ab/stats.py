"""Percentile-bootstrap confidence intervals over seeds, for one arm and for the difference of two."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

RESAMPLES = 10_000


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float

    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi}


def _values(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
        raise ValueError(f"a bootstrap needs a non-empty list of finite numbers, got {list(x)!r}")
    return a


def mean_ci(x: Sequence[float], level: float = 0.95, seed: int = 0) -> Interval:
    """The mean of ``x`` and the percentile-bootstrap interval of that mean."""
    a = _values(x)
    means = a[np.random.default_rng(seed).integers(0, a.size, (RESAMPLES, a.size))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(a.mean()), float(lo), float(hi))


def diff_ci(x: Sequence[float], y: Sequence[float], level: float = 0.95, seed: int = 0) -> Interval:
    """``mean(x) − mean(y)`` for independent samples (different seeds), seeds resampled within each."""
    a, b = _values(x), _values(y)
    rng = np.random.default_rng(seed)
    d = a[rng.integers(0, a.size, (RESAMPLES, a.size))].mean(1) - b[rng.integers(0, b.size, (RESAMPLES, b.size))].mean(1)
    lo, hi = np.quantile(d, [(1 - level) / 2, (1 + level) / 2])
    return Interval(float(a.mean() - b.mean()), float(lo), float(hi))
