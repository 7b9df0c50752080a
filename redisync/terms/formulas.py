"""The terms' formulas, written once for numpy arrays and torch tensors.

The torch terms (:mod:`redisync.terms.torch`) and the numpy terms (:mod:`redisync.terms.numpy`) hold their
state in different array types; what they compute from it — a time step's bin, the failure EMA's
step, the start-bin distributions of G groups, the group draw's weights, a normaliser's moments
from its pooled sums — is defined here, against the few operations where the two libraries differ
(:class:`NumpyOps`, and the torch terms' ``TorchOps``). Everything else is arithmetic and indexing
that both spell the same way, so a change to a formula is one change for both kinds of term.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidSchema

UniformMix = Literal["code", "paper"]
MIXES = ("code", "paper")


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
    p = _unnormalised(g, per_bin, kernel, mix, ops)
    if not math.isfinite(float(p.sum())):
        wide = ops.wide(g)
        top = ops.row_max(wide)
        top = ops.where(top > 0, top, np.finfo(np.float64).tiny)
        p = _unnormalised(ops.cast(wide / top, ema), ops.cast(per_bin / top, ema), kernel, mix, ops)
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


SMALL_SHARD_ENVS = 256  # the follow-up's P1: unsynced shards of 64 envs (code mix) did worse than pooled ones


class SmallUnsyncedShardWarning(UserWarning):
    """A ``local`` sampler with the code's uniform mix on a shard of fewer than 256 envs."""


def warn_if_small_unsynced_shard(mode: str, mix: str, num_envs: int | None) -> None:
    """Warn (once per call site) where the pre-registered follow-up found that not syncing hurt: a
    ``local`` sampler with ``uniform_mix="code"`` on fewer than :data:`SMALL_SHARD_ENVS` envs."""
    if mode == "local" and mix == "code" and num_envs is not None and num_envs < SMALL_SHARD_ENVS:
        warnings.warn(
            f"AdaptiveMotionSampler(mode='local', uniform_mix='code') on {num_envs} envs per shard: in redisync's "
            f"pre-registered follow-up (docs/ab/follow-up/report.md) unsynced shards of 64 envs tracked less of the "
            f"motion than pooled ones; below {SMALL_SHARD_ENVS} envs per shard, sync the sampler (mode='pooled')",
            SmallUnsyncedShardWarning,
            stacklevel=3,
        )


def check_sampler_arguments(
    modes: Sequence[str],
    mode: str,
    mix: str,
    frames: tuple[int, ...],
    step_dt: float,
    kernel_size: int,
    uniform_ratio: float,
    group_uniform_ratio: float,
    group_names: Sequence[str] | None,
) -> None:
    """The adaptive sampler's arguments, checked the same way for every kind of term."""
    if mode not in modes:
        raise InvalidSchema(f"sampler mode must be one of {tuple(modes)}, got {mode!r}")
    if mix not in MIXES:
        raise InvalidSchema(f"uniform_mix must be one of {MIXES}, got {mix!r}")
    if not frames or min(frames) < 1 or step_dt <= 0 or kernel_size < 1:
        raise InvalidSchema("num_frames >= 1 (for every group), step_dt > 0 and kernel_size >= 1 are required")
    if uniform_ratio < 0 or (mix == "paper" and uniform_ratio > 1) or not 0 <= group_uniform_ratio <= 1:
        raise InvalidSchema(
            "uniform_ratio >= 0 (at most 1 with uniform_mix='paper') and group_uniform_ratio in [0, 1] are required"
        )
    if group_names is not None and len(group_names) != len(frames):
        raise InvalidSchema(f"group_names has {len(group_names)} names for {len(frames)} groups")
