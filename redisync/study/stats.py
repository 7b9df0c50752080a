"""The study's pre-registered statistics on paired differences (arms share seeds, so they pair).

For a contrast ``a − b`` the per-seed differences ``d`` give: an exact two-sided sign-flip
permutation test (every one of the 2ⁿ sign patterns; under "no difference" each is as likely), a
t-interval for the mean difference, Holm's correction across the family of primary contrasts, and
an equivalence test (two one-sided t-tests against ``±margin``): "no difference" is claimed only
when the equivalence test says so, never from a non-significant test alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Contrast:
    """One paired contrast: what was compared, its estimate and every test's answer."""

    name: str
    n: int
    mean: float
    lo: float  # the (1 − alpha) t-interval of the mean difference
    hi: float
    p_sign_flip: float
    p_holm: float | None  # None outside the primary family
    margin: float
    p_equivalence: float  # TOST: the larger of the two one-sided p-values

    def significant(self, alpha: float = 0.05) -> bool:
        p = self.p_holm if self.p_holm is not None else self.p_sign_flip
        return p < alpha

    def equivalent(self, alpha: float = 0.05) -> bool:
        return self.p_equivalence < alpha

    def verdict(self, alpha: float = 0.05) -> str:
        if self.significant(alpha):
            return "higher" if self.mean > 0 else "lower"
        return "equivalent" if self.equivalent(alpha) else "inconclusive"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def differences(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """``a − b`` seed by seed; both must list the same seeds in the same order, all finite."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape or x.size < 2:
        raise ValueError(f"a paired contrast needs two lists of the same length >= 2, got {x.size} and {y.size}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("a paired contrast needs finite values")
    return x - y


def sign_flip_p(d: Sequence[float]) -> float:
    """Exact two-sided p-value of the mean of ``d`` under random signs (all 2ⁿ patterns)."""
    d = np.asarray(d, dtype=np.float64)
    result = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", alternative="two-sided", n_resamples=math.inf
    )
    return float(result.pvalue)


def t_interval(d: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    d = np.asarray(d, dtype=np.float64)
    half = stats.t.ppf((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def equivalence_p(d: Sequence[float], margin: float) -> float:
    """TOST: the p-value of "the mean difference lies outside ±margin" (small: equivalent)."""
    d = np.asarray(d, dtype=np.float64)
    se = d.std(ddof=1) / math.sqrt(d.size)
    if se == 0:
        return 0.0 if abs(d.mean()) < margin else 1.0
    lower = stats.t.sf((d.mean() + margin) / se, d.size - 1)  # H0: mean <= −margin
    upper = stats.t.cdf((d.mean() - margin) / se, d.size - 1)  # H0: mean >= +margin
    return float(max(lower, upper))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    order = np.argsort(p)
    adjusted = np.empty_like(p)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (p.size - rank) * p[i]))
        adjusted[i] = running
    return adjusted.tolist()


def contrast(name: str, a: Sequence[float], b: Sequence[float], margin: float, level: float = 0.95) -> Contrast:
    d = differences(a, b)
    lo, hi = t_interval(d, level)
    return Contrast(name, int(d.size), float(d.mean()), lo, hi, sign_flip_p(d), None, margin, equivalence_p(d, margin))


def primary_family(contrasts: Sequence[Contrast]) -> list[Contrast]:
    """The contrasts with Holm-adjusted sign-flip p-values (the pre-registered family)."""
    adjusted = holm([c.p_sign_flip for c in contrasts])
    return [Contrast(**{**c.to_dict(), "p_holm": p}) for c, p in zip(contrasts, adjusted)]
