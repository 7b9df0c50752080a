"""The study's pre-registered statistics on paired differences (arms share seeds, so they pair).

For a contrast ``a − b`` the per-seed differences ``d`` give: an exact two-sided sign-flip
permutation test (every one of the 2ⁿ sign patterns; under "no difference" each is as likely), a
95 % t-interval for the mean difference, an equivalence test (two one-sided t-tests against
``±margin``) with its matching 90 % interval (equivalent at 5 % exactly when that interval lies
inside ±margin), and the difference the contrast could detect (80 % power at 5 %, from the seeds'
spread). Across the family of primary contrasts Holm's correction is applied to both kinds of claim:
the sign-flip p-values and the equivalence p-values. "No difference" is claimed only when the
(corrected) equivalence test says so, never from a non-significant test alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats


@dataclass(frozen=True)
class Contrast:
    """One paired contrast: what was compared, its estimate and every test's answer."""

    name: str
    n: int
    mean: float
    lo: float  # the 95 % t-interval of the mean difference
    hi: float
    p_sign_flip: float
    p_holm: float | None  # None outside the primary family
    margin: float
    p_equivalence: float  # TOST: the larger of the two one-sided p-values
    lo90: float  # the 90 % t-interval: TOST's own (equivalent at 5 % iff it lies inside ±margin)
    hi90: float
    p_equivalence_holm: float | None  # None outside the primary family
    detectable: float  # the difference detected with 80 % power at 5 % (two-sided paired t), given the spread

    def significant(self, alpha: float = 0.05) -> bool:
        p = self.p_holm if self.p_holm is not None else self.p_sign_flip
        return p < alpha

    def equivalent(self, alpha: float = 0.05) -> bool:
        p = self.p_equivalence_holm if self.p_equivalence_holm is not None else self.p_equivalence
        return p < alpha

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


def sign_flip_p(values: ArrayLike) -> float:
    """Exact two-sided p-value of the mean of ``d`` under random signs (all 2ⁿ patterns)."""
    d = np.asarray(values, dtype=np.float64)
    result = stats.permutation_test(
        (d,), np.mean, permutation_type="samples", alternative="two-sided", n_resamples=math.inf
    )
    return float(result.pvalue)


def t_interval(values: ArrayLike, level: float = 0.95) -> tuple[float, float]:
    d = np.asarray(values, dtype=np.float64)
    half = stats.t.ppf((1 + level) / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return float(d.mean() - half), float(d.mean() + half)


def equivalence_p(values: ArrayLike, margin: float) -> float:
    """TOST: the p-value of "the mean difference lies outside ±margin" (small: equivalent)."""
    d = np.asarray(values, dtype=np.float64)
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


def detectable_difference(values: ArrayLike, power: float = 0.8, alpha: float = 0.05) -> float:
    """The mean difference a two-sided paired t-test at ``alpha`` detects with ``power``, for the
    spread and the number of seeds of ``d`` (the usual approximation by t quantiles)."""
    d = np.asarray(values, dtype=np.float64)
    dof = d.size - 1
    return float((stats.t.ppf(1 - alpha / 2, dof) + stats.t.ppf(power, dof)) * d.std(ddof=1) / math.sqrt(d.size))


def contrast(name: str, a: Sequence[float], b: Sequence[float], margin: float) -> Contrast:
    d = differences(a, b)
    lo, hi = t_interval(d, 0.95)
    lo90, hi90 = t_interval(d, 0.90)
    return Contrast(
        name,
        int(d.size),
        float(d.mean()),
        lo,
        hi,
        sign_flip_p(d),
        None,
        margin,
        equivalence_p(d, margin),
        lo90,
        hi90,
        None,
        detectable_difference(d),
    )


def primary_family(contrasts: Sequence[Contrast]) -> list[Contrast]:
    """The contrasts of the pre-registered family, their sign-flip and equivalence p-values each
    Holm-adjusted over the family (a claim of a difference and a claim of none alike)."""
    differ = holm([c.p_sign_flip for c in contrasts])
    same = holm([c.p_equivalence for c in contrasts])
    return [
        dataclasses.replace(c, p_holm=p, p_equivalence_holm=q) for c, p, q in zip(contrasts, differ, same, strict=False)
    ]
