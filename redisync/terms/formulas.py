"""The terms' formulas, written once for numpy arrays and torch tensors.

The torch terms (`redisync.terms.torch`) and the numpy terms (`redisync.terms.numpy`) hold their
state in different array types; what they compute from it — a time step's bin, the failure EMA's
step, the start-bin distributions of G groups, the group draw's weights, a normaliser's moments
from its pooled sums — is defined here, against the few operations where the two libraries differ
(`NumpyOps`, and the torch terms' ``TorchOps``). Everything else is arithmetic and indexing
that both spell the same way, so a change to a formula is one change for both kinds of term.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import numpy as np
from numpy.typing import NDArray

from .role import Role

UniformMix = Literal["code", "paper"]
MIXES: tuple[str, ...] = get_args(UniformMix)


class ArrayOps(Protocol):
    """Where numpy and torch spell an operation differently (``Any`` is an array of the backend)."""

    def cat(self, parts: Sequence[Any], axis: int) -> Any:
        """Concatenate ``parts`` along ``axis``."""

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """Element-wise choice: ``a`` where ``cond`` holds, else ``b``."""

    def minimum(self, a: Any, b: Any) -> Any:
        """Element-wise minimum."""

    def zeros_like(self, x: Any) -> Any:
        """Zeros of ``x``'s shape and dtype."""

    def pad_index(self, index: Any, pad: int) -> Any:
        """``[G, W] -> [G, W + pad]``, the last column repeated: a ragged layout's indices on its grid."""

    def wide(self, x: Any) -> Any:
        """``x`` in float64 (sums and the fleet's part are kept in float64)."""

    def cast(self, x: Any, like: Any) -> Any:
        """``x`` in ``like``'s dtype."""

    def row_max(self, x: Any) -> Any:
        """``[G, W] -> [G, 1]``: the maximum of each row."""

    def smooth(self, p: Any, kernel: Any) -> Any:
        """The rows of ``p`` (padded by ``k - 1``) correlated with ``kernel``: BeyondMimic's smoothing."""

    def on_host(self, x: Any) -> bool:
        """Whether reading ``x``'s values costs nothing (on the CPU; a CUDA tensor's would wait for its device)."""

    def isfinite(self, x: Any) -> Any:
        """Element-wise: finite."""


class NumpyOps:
    """The formulas' operations in numpy's spelling."""

    def cat(self, parts: Any, axis: Any) -> Any:
        """Concatenate ``parts`` along ``axis``."""
        return np.concatenate(parts, axis=axis)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """Element-wise choice: ``a`` where ``cond`` holds, else ``b``."""
        return np.where(cond, a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        """Element-wise minimum."""
        return np.minimum(a, b)

    def zeros_like(self, x: Any) -> Any:
        """Zeros of ``x``'s shape and dtype."""
        return np.zeros_like(x)

    def pad_index(self, index: Any, pad: Any) -> Any:
        """The indices that pad a ragged layout to its grid."""
        return np.concatenate([index, np.repeat(index[:, -1:], pad, axis=1)], axis=1)

    def wide(self, x: Any) -> Any:
        """``x`` in float64 (sums and the fleet's part are kept in float64)."""
        return np.asarray(x, dtype=np.float64)

    def cast(self, x: Any, like: Any) -> Any:
        """``x`` in ``like``'s dtype."""
        return np.asarray(x).astype(like.dtype, copy=False)

    def row_max(self, x: Any) -> Any:
        """The maximum of each row."""
        return x.max(axis=1, keepdims=True)

    def smooth(self, p: Any, kernel: Any) -> Any:
        """BeyondMimic's kernel smoothing along the bins (a 1-D convolution per row)."""
        width = p.shape[1] - kernel.shape[0] + 1
        out = kernel[0] * p[:, :width]
        for j in range(1, kernel.shape[0]):
            out = out + kernel[j] * p[:, j : j + width]
        return out

    def on_host(self, x: Any) -> bool:
        """numpy arrays are host memory."""
        return True

    def isfinite(self, x: Any) -> Any:
        """Element-wise: finite."""
        return np.isfinite(x)


NUMPY = NumpyOps()


@dataclass(frozen=True)
class BinGeometry:
    """Where G groups' bins sit: end to end in the flat EMA (the synced key), and row by row on a
    ``[G, width]`` grid (``width`` = the most bins of any group) where the distributions are built.
    Index arrays in numpy; a torch term holds them as buffers under the same names."""

    bin_counts: tuple[int, ...]
    bins: NDArray[Any]  # [G]
    offsets: NDArray[Any]  # [G]: where each group starts in the flat EMA
    real: NDArray[Any]  # [G, width]: a group's own bins
    inverse_bins: NDArray[Any]  # [G, 1] float64
    last: NDArray[Any]  # [G, width]: the grid's gather; past its bins, a row repeats its last one
    zero: NDArray[Any]  # the same, pointing at an appended zero instead

    @property
    def groups(self) -> int:
        """The number of groups."""
        return len(self.bin_counts)

    @property
    def width(self) -> int:
        """The widest group's bin count (the grid's width)."""
        return max(self.bin_counts)

    @property
    def size(self) -> int:
        """The total number of bins, every group's end to end."""
        return sum(self.bin_counts)

    @property
    def ragged(self) -> bool:
        """Whether the groups' bin counts differ."""
        return len(set(self.bin_counts)) > 1

    @classmethod
    def of(cls, bin_counts: Sequence[int]) -> BinGeometry:
        """The geometry of groups with these frame counts at this step."""
        counts = tuple(int(b) for b in bin_counts)
        bins = np.asarray(counts, dtype=np.int64)
        offsets = np.cumsum(bins) - bins
        columns = np.arange(max(counts))
        real = columns[None, :] < bins[:, None]
        last = offsets[:, None] + np.minimum(columns[None, :], bins[:, None] - 1)
        return cls(
            counts,
            bins,
            offsets,
            real,
            (1.0 / bins.astype(np.float64))[:, None],
            last,
            np.where(real, last, sum(counts)),
        )


def bin_counts_of(frame_counts: Sequence[int], step_dt: float) -> tuple[int, ...]:
    """BeyondMimic's bin count per motion: one bin per second of motion, plus one."""
    return tuple(int(f // (1 / step_dt)) + 1 for f in frame_counts)


def grid(flat: Any, geometry: Any, pad: int, ops: ArrayOps) -> Any:
    """``[G, width + pad]``: each row its group's bins, then its last bin repeated (replicate padding)."""
    return flat[geometry.last if pad == 0 else ops.pad_index(geometry.last, pad)]


def group_sums(flat: Any, geometry: Any, ops: ArrayOps) -> Any:
    """Per group, the sum of its bins."""
    if not geometry.ragged:
        return flat.reshape(geometry.groups, geometry.width).sum(axis=1)
    return ops.cat([flat, ops.zeros_like(flat[:1])], 0)[geometry.zero].sum(axis=1)


def bin_of(time_steps: Any, bins: Any, frames: Any, ops: ArrayOps) -> Any:
    """Each time step's bin inside its motion (BeyondMimic's ``t·B // T``, clamped to the motion's bins)."""
    b = ops.minimum((time_steps * bins) // frames, bins - 1)
    return ops.where(b < 0, 0, b)


def ema_step(ema: Any, current: Any, alpha: float) -> None:
    """Once per env step, in place: ``ema ← α·current + (1 − α)·ema``."""
    ema *= 1 - alpha
    ema += alpha * current


def grouped_probabilities(
    ema: Any, geometry: Any, uniform_ratio: float, kernel: Any, ops: ArrayOps, mix: UniformMix = "code"
) -> Any:
    """Every group's start-bin distribution at once from the flat EMA: ``[G, width]``, each row a
    distribution over its group's bins, zero past them, in ``ema``'s dtype.

    ``code`` (BeyondMimic's code): ``p ∝ smooth(ema + ε/B)``; ``paper``: ``ε/B + (1 − ε)·smooth(ema)/Σ``
    (uniform while nothing failed). An EMA near the top of the dtype's range (a fleet sum beyond
    float32, say) is divided by its row's maximum first, which leaves every distribution as it is up
    to rounding, so nothing turns into inf or NaN.
    """
    g = grid(ema, geometry, kernel.shape[0] - 1, ops)
    # ε/B: a Python number when every group has B bins (BeyondMimic's own arithmetic), else per row
    per_bin = (
        uniform_ratio / geometry.width if not geometry.ragged else uniform_ratio * ops.cast(geometry.inverse_bins, ema)
    )
    with np.errstate(over="ignore", invalid="ignore"):  # (numpy's) an overflow is what the check below looks for
        p = _unnormalised(g, per_bin, kernel, mix, ops)
        finite = math.isfinite(float(p.sum())) if ops.on_host(p) else True

    def rescaled() -> Any:
        wide = ops.wide(g)
        top = ops.row_max(wide)
        top = ops.where(top > 0, top, np.finfo(np.float64).tiny)
        return _unnormalised(ops.cast(wide / top, ema), ops.cast(per_bin / top, ema), kernel, mix, ops)

    if ops.on_host(p):
        if not finite:
            p = rescaled()
    else:  # a device's value is not branched on (that waits for the device): both made, one kept
        p = ops.where(ops.isfinite(p.sum()), p, rescaled())
    if geometry.ragged:
        p = p * geometry.real
    if mix == "code":
        return p / p.sum(axis=1, keepdims=True)
    total = p.sum(axis=1, keepdims=True)
    uniform = ops.cast(geometry.inverse_bins, p)
    shape = ops.where(total > 0, p / ops.where(total > 0, total, 1), uniform)  # no failure yet: uniform
    p = per_bin + (1 - uniform_ratio) * shape
    return p * geometry.real if geometry.ragged else p


def _unnormalised(g: Any, per_bin: Any, kernel: Any, mix: UniformMix, ops: ArrayOps) -> Any:
    """``smooth(ema + ε/B)`` for the code's formula, ``smooth(ema)`` for the paper's (``g`` is padded by k − 1)."""
    p = g + per_bin if mix == "code" else g
    return p if kernel.shape[0] == 1 else ops.smooth(p, ops.cast(kernel, p))


def smoothing_kernel(kernel_size: int, kernel_lambda: float, dtype: Any = np.float32) -> NDArray[Any]:
    """BeyondMimic's non-causal kernel ``λʲ / Σλʲ``, built in the term's dtype as BeyondMimic builds it."""
    kernel = np.asarray([kernel_lambda**i for i in range(kernel_size)], dtype=dtype)
    normalised: NDArray[Any] = kernel / kernel.sum()
    return normalised


def group_weights(mass: Any, group_uniform_ratio: float, groups: int, ops: ArrayOps) -> Any:
    """The distribution over groups (float64): each group's failure mass mixed with a uniform floor
    ``λ / G`` (the paper's form, so it does not depend on the env count)."""
    total = float(mass.sum())
    shape = mass / total if 0 < total < math.inf else ops.zeros_like(mass) + 1 / groups
    return group_uniform_ratio / groups + (1 - group_uniform_ratio) * shape


def moments(count: Any, total: Any, squares: Any, ops: ArrayOps) -> tuple[Any, Any]:
    """Mean and (population) variance from a count, ``Σx`` and ``Σx²`` (float64, shifted sums welcome;
    a variance that rounds below zero is zero)."""
    mean = total / count
    var = squares / count - mean * mean
    return mean, ops.where(var > 0, var, 0.0)


def pooled_average(own_weight: float, own_average: float, others: tuple[float, float]) -> float:
    """The fleet's mean of the shards' averages, each weighted by what is behind it (holosoma's
    tracker: the episodes, up to its window): ``(Σ wᵢ·avgᵢ) / Σ wᵢ`` over the rest of the fleet's
    ``(count, sum)`` and this shard's ``(own_weight, own_average)``. While nobody has counted anything
    it is this shard's own average (what the shard would use without sync)."""
    count = others[0] + own_weight
    return (others[1] + own_weight * own_average) / count if count > 0 else own_average


# A failure EMA's statistics, from the formulas (code mix, kernel 1): ``p_b ∝ ema_b + ε/B``, and the
# EMA of per-step failure counts has mass F = failures per env step (its weights sum to 1).
# - noise: a bin's EMA averages about n = F / (B·α) failures (its share of the EMA's window of 1/α
#   steps); for Poisson counts its relative standard deviation is sqrt(α / (2 f_b)) = 1 / sqrt(2n).
# - flattening: the uniform share of the distribution is ε / (F + ε) with the code's mix (ε with the
#   paper's): a shard that sees 1/N of the fleet's failures mixes in more of it than the fleet would.
# A fleet of N such shards pools N·F failures per step: n·N per bin, noise / sqrt(N), ε / (N·F + ε).
@dataclass(frozen=True)
class WarningThresholds:
    """When a shard's own failure EMA is a poor guide (noise or uniform share at least these) and the
    fleet's pooled one a fair guide (both at most these): the drift warning's rule, in the EMA's units."""

    noisy_relative_sd: float
    flat_uniform_share: float
    fair_relative_sd: float
    fair_uniform_share: float


# Calibrated against the harm the second follow-up measured (docs/ab/warning-calibration.md: it fires on
# the seeds of every arm where unsynced shards did worse, and stays quiet on the 256-env arm where no harm
# was shown); chosen in-sample on the toy task's runs, so a firing is a risk, not proof of harm.
WARNING_THRESHOLDS = WarningThresholds(
    noisy_relative_sd=0.4, flat_uniform_share=0.5, fair_relative_sd=0.2, fair_uniform_share=0.5
)


def ema_statistics(ema_mass: float, bins: int, alpha: float, uniform_ratio: float, mix: str) -> dict[str, float]:
    """What a failure EMA of mass ``ema_mass`` (failures per env step, as the EMA sees them) over
    ``bins`` bins gives the sampler: ``failures_per_bin_window`` (n), ``ema_relative_noise``
    (1/sqrt(2n)) and ``uniform_share`` (the uniform part of the start distribution)."""
    n = ema_mass / (bins * alpha)
    return {
        "failures_per_bin_window": n,
        "ema_relative_noise": float("inf") if n <= 0 else (2 * n) ** -0.5,
        "uniform_share": uniform_ratio if mix == "paper" else uniform_ratio / (ema_mass + uniform_ratio),
    }


def _poor(stats: dict[str, float], rule: WarningThresholds) -> list[str]:
    """Why an EMA with these statistics is a poor guide for start frames (none: not a poor one)."""
    reasons = []
    if stats["ema_relative_noise"] >= rule.noisy_relative_sd:
        reasons.append(
            f"about {stats['failures_per_bin_window']:.2g} failures per bin in the EMA's window, a relative noise of "
            f"{stats['ema_relative_noise']:.2f} per bin"
        )
    if stats["uniform_share"] >= rule.flat_uniform_share:
        reasons.append(f"a uniform share of {stats['uniform_share']:.2f} in its start distribution")
    return reasons


def _fair(stats: dict[str, float], rule: WarningThresholds) -> bool:
    return stats["ema_relative_noise"] <= rule.fair_relative_sd and stats["uniform_share"] <= rule.fair_uniform_share


def ema_warning(
    shard: dict[str, float], fleet: dict[str, float], where: str, rule: WarningThresholds = WARNING_THRESHOLDS
) -> str | None:
    """Why a shard's own failure EMA is a poor guide for its start frames while the fleet's pooled EMA
    would be a fair one, with the numbers; None otherwise (`WarningThresholds`). Where the
    fleet's EMA is not fair either — a policy that hardly fails any more — syncing would not help,
    and nothing is said."""
    reasons = _poor(shard, rule)
    if not reasons or not _fair(fleet, rule):
        return None
    return (
        f"{where}: this shard's own failure EMA has {' and '.join(reasons)}, where the fleet's pooled EMA would "
        f"have a relative noise of {fleet['ema_relative_noise']:.2f} and a uniform share of "
        f"{fleet['uniform_share']:.2f}: unsynced shards this noisy trained worse in our studies (a risk, not "
        f"proof of harm); sync the sampler (mode='pooled') so that it samples from the fleet's failures"
    )


# The measured drift's rule: a shard that samples from its own EMA (``observe``) warns once the mean of its
# measured drift (the TV distance of its start distribution from the pooled one at the same moment, once
# its EMA's window has filled and a fleet state has arrived) is at least DRIFT_WARNING_TV over at least
# DRIFT_WARNING_MEASUREMENTS measurements. Calibrated on the walker study's records
# (docs/ab/drift-warning-calibration.md: the geometric midpoint between the pooled runs' largest such mean
# and the local runs' smallest, where unsynced shards learnt the skill segments worse), in-sample; it is
# judged on held-out walker configurations by the fifth study (docs/ab/fifth-study-plan.md).
DRIFT_WARNING_TV = 0.24
DRIFT_WARNING_MEASUREMENTS = 4


def drift_warning(mean_tv: float, measurements: int, where: str, threshold: float = DRIFT_WARNING_TV) -> str | None:
    """Why a shard's measured drift from the pooled distribution is as large as where unsynced shards
    trained worse, with the numbers; None while it is not (or measured too few times)."""
    if measurements < DRIFT_WARNING_MEASUREMENTS or not mean_tv >= threshold:
        return None
    return (
        f"{where}: this shard's start distribution is on average {mean_tv:.2f} (total variation, over "
        f"{measurements} measurements) from the fleet's pooled one, at least the {threshold:.2f} at which "
        "unsynced shards of the walker study learnt worse than pooled ones (a risk, not proof of harm: see "
        "'redisync advise'); sync the sampler (mode='pooled') so that every shard samples from the fleet's failures"
    )


class EmaStatisticsWarning(UserWarning):
    """A ``local`` sampler whose own failure EMA is a poor guide where the fleet's would not be (`ema_warning`)."""


class DriftWarning(UserWarning):
    """An ``observe`` sampler whose measured drift from pooled is as large as where unsynced shards
    trained worse (`drift_warning`)."""


class EmaWatch:
    """A sampler's watch on its own failure EMA, the same for the numpy and the torch sampler.

    `metrics` gives the EMA's mass (the shard's failures per env step, ``ema_failures_per_step``) and
    its statistics (`ema_statistics`, for its worst group) under ``ema_failures_per_bin_window``, ``ema_relative_noise`` and ``ema_uniform_share``, whatever the
    mode (with sync, what the shard would have without it). A ``local`` sampler that knows the size of
    its fleet (``fleet_shards``: the shards that would pool their failures) warns once, with the
    numbers, where `ema_warning` says its own EMA is a poor guide while the fleet's would be a
    fair one — judged at run time from what the shard saw, once the EMA's window (1/α steps) has
    filled, taking the other shards to see as many failures as this one."""

    def __init__(
        self, role: Role, mix: str, alpha: float, uniform_ratio: float, bins: Sequence[int], fleet_shards: int | None
    ):
        self.mix, self.alpha, self.uniform_ratio, self.bins = mix, alpha, uniform_ratio, tuple(bins)
        self.fleet_shards = fleet_shards
        self.local, self.steps, self.warned = role is Role.ALONE, 0, False
        self.observing = role is Role.OBSERVES
        self.drift_sum, self.drift_measurements = 0.0, 0

    def measured(self, drift_tv: float, fleet_arrived: bool) -> dict[str, float]:
        """An ``observe`` sampler's measured drift (its distribution against the pooled one, now):
        its mean since the EMA's window filled and a fleet state arrived, as metrics; warns once
        where `drift_warning` says it is as large as where unsynced shards trained worse."""
        if not self.observing:
            return {}
        if fleet_arrived and self.steps * self.alpha >= 1.0:
            self.drift_sum, self.drift_measurements = self.drift_sum + drift_tv, self.drift_measurements + 1
        mean = self.drift_sum / self.drift_measurements if self.drift_measurements else 0.0
        if not self.warned:
            why = drift_warning(
                mean, self.drift_measurements, f"AdaptiveMotionSampler(mode='observe') after {self.steps} steps"
            )
            if why is not None:
                warnings.warn(why, DriftWarning, stacklevel=3)
                self.warned = True
        return {"drift_tv_mean": mean, "drift_measurements": float(self.drift_measurements)}

    def statistics(self, group_masses: Sequence[float], shards: int = 1) -> dict[str, float]:
        """The worst group's statistics (the fewest failures per bin, the most noise, the largest
        uniform share) of an EMA that pools ``shards`` shards like this one."""
        per = [
            ema_statistics(shards * m, b, self.alpha, self.uniform_ratio, self.mix)
            for m, b in zip(group_masses, self.bins, strict=True)
        ]
        return {
            "failures_per_bin_window": min(p["failures_per_bin_window"] for p in per),
            "ema_relative_noise": max(p["ema_relative_noise"] for p in per),
            "uniform_share": max(p["uniform_share"] for p in per),
        }

    def metrics(self, group_masses: Sequence[float]) -> dict[str, float]:
        """The statistics as metrics; warns once where a ``local`` shard's EMA is poor and the fleet's not."""
        stats = self.statistics(group_masses)
        if self.local and self.fleet_shards and not self.warned and self.steps * self.alpha >= 1.0:
            fleet = self.statistics(group_masses, self.fleet_shards)
            why = ema_warning(stats, fleet, f"AdaptiveMotionSampler(mode='local') after {self.steps} steps")
            if why is not None:
                warnings.warn(why, EmaStatisticsWarning, stacklevel=3)
                self.warned = True
        return {
            "ema_failures_per_step": float(sum(group_masses)),  # (what `redisync advise` takes)
            "ema_failures_per_bin_window": stats["failures_per_bin_window"],
            "ema_relative_noise": min(stats["ema_relative_noise"], 1e9),  # (finite, for a logger)
            "ema_uniform_share": stats["uniform_share"],
        }


def moved_beyond(
    built: Any, now: Any, geometry: Any, tol: float, uniform_ratio: float, ops: ArrayOps, scale: Any = None
) -> bool:
    """Whether some group's EMA moved since ``built`` by more than ``tol`` of its mass (``scale``'s,
    default ``now``'s) plus ε: when a sampler rebuilds its distributions (``tol`` 0: on any change)."""
    if tol == 0:
        return not bool((built == now).all())
    moved = group_sums(abs(now - built), geometry, ops)
    scale = group_sums(now if scale is None else scale, geometry, ops) + uniform_ratio
    return not bool((moved <= tol * scale).all())


def distribution_summary(
    probs: NDArray[np.float64],
    bins: NDArray[Any],
    drift: NDArray[np.float64] | None,
    names: Sequence[str] | None,
    worst: int,
) -> dict[str, float]:
    """Entropy (normalised by each group's bin count), top bin and drift of ``[G, max bins]``
    distributions. Ungrouped (``names`` None): BeyondMimic's metric names. Grouped: the mean and
    the extreme over groups, and the ``worst`` groups by name — bounded whatever G is."""
    logs = np.log(np.asarray(bins, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = np.where(logs > 0, -(probs * np.log(probs + 1e-12)).sum(axis=1) / np.where(logs > 0, logs, 1), 1.0)
    top_prob, top_bin = probs.max(axis=1), probs.argmax(axis=1)
    if names is None:
        out = {
            "sampling_entropy": float(entropy[0]),
            "sampling_top1_prob": float(top_prob[0]),
            "sampling_top1_bin": float(top_bin[0]) / int(bins[0]),
        }
        if drift is not None:
            out["drift_tv"] = float(drift[0])
        return out
    out = {
        "sampling_entropy": float(entropy.mean()),
        "sampling_entropy_min": float(entropy.min()),
        "sampling_top1_prob": float(top_prob.mean()),
        "sampling_top1_prob_max": float(top_prob.max()),
    }
    k = min(worst, len(names))
    # the sharpest groups: where the curriculum concentrates the fleet's starts
    for g in np.argsort(entropy, kind="stable")[:k]:
        out[f"sampling_entropy/{names[g]}"] = float(entropy[g])
    if drift is not None:
        out["drift_tv"], out["drift_tv_max"] = float(drift.mean()), float(drift.max())
        for g in np.argsort(-drift, kind="stable")[:k]:
            out[f"drift_tv/{names[g]}"] = float(drift[g])
    return out
