"""The whole-body-tracking adaptive start-frame sampler (BeyondMimic's ``MotionCommand``), synced.

The algorithm, unchanged: one bin per second of motion; each env step the per-bin failure EMA
takes in the bins of the envs that failed, ``ema ← α·current + (1 − α)·ema``; at reset the start
distribution is ``p = ema + ε / bin_count``, right-padded by ``k − 1`` (replicate), convolved with
the kernel ``λʲ / Σλʲ`` and normalised; a bin is drawn, then a uniform offset inside it.

What sync changes is only *which* EMA feeds ``p``:

- ``local``: the shard's own EMA (no sync; the same numbers as the unsynced algorithm);
- ``pooled`` (default): the own-substituted fleet sum of every shard's own EMA — by linearity the
  EMA of the pooled failure counts, i.e. what one unsharded run of all envs would use;
- ``weighted``: the original proposal, kept for comparison: at each reset boundary the shard's EMA is
  overwritten by the failure-weighted mean of the shards' EMAs and keeps evolving locally;
- ``broadcast``: the owner shard's own EMA is everybody's (holosoma's rank-0 semantics).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping

import numpy as np
import torch
from torch import nn

from ..codec import PullResult
from ..errors import InvalidSchema
from ..schema import BroadcastSpec, MergeSpec, broadcast, merge

Mode = Literal["local", "pooled", "weighted", "broadcast"]
MODES = ("local", "pooled", "weighted", "broadcast")


FPS = 50  # the control rate of the tracking tasks: one bin per second of motion is 50 frames


def frames_for_bins(bins: int, fps: int = FPS) -> int:
    """The motion length in frames whose BeyondMimic ``bin_count`` is exactly ``bins``."""
    return bins * fps - 1


def sampling_probabilities(ema: torch.Tensor, uniform_ratio: float, kernel: torch.Tensor) -> torch.Tensor:
    """BeyondMimic's start-bin distribution from a failure EMA (vectorised, on ``ema``'s device).

    Computed in ``ema``'s dtype when every intermediate fits it; an EMA near the top of the
    dtype's range (a fleet sum beyond float32, say) is scaled down by its maximum first, which
    leaves the distribution as it is up to rounding, so it never turns into inf or NaN.
    """
    bins = ema.numel()
    p = ema + uniform_ratio / float(bins)
    if not torch.isfinite(p.sum()):
        wide = ema.to(torch.float64)
        top = float(wide.max())
        p = (wide / top + uniform_ratio / float(bins) / top).to(ema.dtype)
    k = kernel.numel()
    if k > 1:
        p = nn.functional.pad(p.view(1, 1, -1), (0, k - 1), mode="replicate")
        p = nn.functional.conv1d(p, kernel.to(p.dtype).view(1, 1, -1)).view(-1)
    return p / p.sum()


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * float((p - q).abs().sum())


class AdaptiveMotionSampler(nn.Module):
    """Adaptive start-frame sampling for one shard's envs, optionally synced through the store.

    Call :meth:`record_failures` at reset with the time steps and failure flags of the envs being
    reset, :meth:`step` once per env step, and :meth:`sample` for the new start frames.
    """

    def __init__(
        self,
        num_frames: int,
        step_dt: float,
        *,
        mode: Mode = "pooled",
        key: str = "motion/bin_failed",
        shard_id: int = 0,
        owner: int = 0,
        alpha: float = 0.001,
        uniform_ratio: float = 0.1,
        kernel_size: int = 1,
        kernel_lambda: float = 0.8,
        stale_after_s: float | None = None,
        rebuild_tol: float = 1e-4,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        if mode not in MODES:
            raise InvalidSchema(f"sampler mode must be one of {MODES}, got {mode!r}")
        if num_frames < 1 or step_dt <= 0 or kernel_size < 1:
            raise InvalidSchema("num_frames >= 1, step_dt > 0 and kernel_size >= 1 are required")
        self.mode, self.key, self.shard_id, self.owner = mode, key, shard_id, owner
        self.num_frames = num_frames
        self.alpha, self.uniform_ratio, self.stale_after_s = alpha, uniform_ratio, stale_after_s
        # local sampling must reproduce the unsynced algorithm exactly: rebuild on every change
        self.rebuild_tol = 0.0 if mode == "local" else rebuild_tol
        self.bin_count = int(num_frames // (1 / step_dt)) + 1
        kw = {"device": device, "dtype": dtype}
        kernel = torch.tensor([kernel_lambda**i for i in range(kernel_size)], **kw)
        self.register_buffer("kernel", kernel / kernel.sum())
        self.register_buffer("bin_failed_count", torch.zeros(self.bin_count, **kw))  # the OWN failure EMA
        self.register_buffer("_current_bin_failed", torch.zeros(self.bin_count, **kw), persistent=False)
        # the rest of the fleet as last applied (pooled), or the fleet value (broadcast)
        self.register_buffer("_fleet", torch.zeros(self.bin_count, device=device, dtype=torch.float64), persistent=False)
        self.register_buffer("_probs", torch.zeros(self.bin_count, **kw), persistent=False)
        self.register_buffer("_own_at_build", torch.full((self.bin_count,), float("nan"), **kw), persistent=False)
        self._failures_since_report = 0.0
        self.fleet_version = 0
        self.rebuilds = 0
        # loading a checkpoint restores the own EMA: this process then resumes its previous life's slot
        self.resumed = False
        self.register_load_state_dict_post_hook(_mark_resumed)

    # ------------------------------------------------------------------ the algorithm

    def bin_of(self, time_steps: torch.Tensor) -> torch.Tensor:
        return torch.clamp((time_steps * self.bin_count) // max(self.num_frames, 1), 0, self.bin_count - 1)

    def record_failures(self, time_steps: torch.Tensor, failed: torch.Tensor) -> None:
        """At reset: the bins in which the reset envs failed become this step's failure counts."""
        if torch.any(failed):
            counts = torch.bincount(self.bin_of(time_steps)[failed], minlength=self.bin_count)
            self._current_bin_failed[:] = counts
            if self.mode == "weighted":
                self._failures_since_report += float(counts.sum())

    def step(self) -> None:
        """Once per env step: fold this step's failures into the own EMA."""
        self.bin_failed_count.mul_(1 - self.alpha).add_(self.alpha * self._current_bin_failed)
        self._current_bin_failed.zero_()

    def sampling_ema(self) -> torch.Tensor:
        """The EMA that decides the start distribution, per mode (the fleet part is float64, so a
        fleet value beyond the sampler's dtype stays finite)."""
        if self.mode == "pooled":
            return self._fleet + self.bin_failed_count.to(torch.float64)
        if self.mode == "broadcast" and self.shard_id != self.owner:
            return self._fleet
        return self.bin_failed_count

    def probabilities(self) -> torch.Tensor:
        """The start-bin distribution, rebuilt only when it could have moved by more than ``rebuild_tol``."""
        own = self.bin_failed_count
        moved = torch.nan_to_num((own - self._own_at_build).abs().sum(), nan=math.inf)
        if float(moved) > self.rebuild_tol * (float(self.sampling_ema().to(torch.float64).sum()) + self.uniform_ratio):
            self._rebuild()
        return self._probs

    def _rebuild(self) -> None:
        dtype = self.bin_failed_count.dtype
        self._probs = sampling_probabilities(self.sampling_ema(), self.uniform_ratio, self.kernel).to(dtype)
        self._own_at_build = self.bin_failed_count.clone()
        self.rebuilds += 1

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Start time steps for ``n`` envs: a bin from the distribution, then a uniform offset inside it."""
        probs = self.probabilities()
        bins = torch.multinomial(probs, n, replacement=True, generator=generator)
        offset = torch.rand(n, device=probs.device, dtype=probs.dtype, generator=generator)
        return ((bins + offset) / self.bin_count * (self.num_frames - 1)).long()

    def metrics(self) -> dict[str, float]:
        """BeyondMimic's sampling metrics and the drift of the own distribution from the one used."""
        p = self.probabilities()
        entropy = -(p * (p + 1e-12).log()).sum() / math.log(self.bin_count)
        pmax, imax = p.max(dim=0)
        own = sampling_probabilities(self.bin_failed_count, self.uniform_ratio, self.kernel)
        return {
            "sampling_entropy": float(entropy),
            "sampling_top1_prob": float(pmax),
            "sampling_top1_bin": float(imax) / self.bin_count,
            "drift_tv": total_variation(own, p),
        }

    # ------------------------------------------------------------------ the seam

    def schema_entries(self) -> Mapping[str, BroadcastSpec | MergeSpec]:
        if self.mode == "local":
            return {}
        if self.mode == "broadcast":
            return {self.key: broadcast(self.bin_count, owner=self.owner)}
        # an EMA is a current state: a fresh restart drops the previous life's slot (a resume takes it over)
        stale = self.stale_after_s if self.mode == "pooled" else None
        return {self.key: merge(self.bin_count, stale_after_s=stale, lifecycle="state")}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        own = self.bin_failed_count.detach().to("cpu", torch.float64).numpy().copy()
        if self.mode == "pooled":
            return {self.key: {"count": 1.0, "sum": own}}
        if self.mode == "weighted":
            count, self._failures_since_report = self._failures_since_report, 0.0
            return {self.key: {"count": count, "sum": count * own}}
        if self.mode == "broadcast" and self.shard_id == self.owner:
            return {self.key: {"value": own}}
        return {}

    def apply_shard_state(self, fleet: PullResult) -> None:
        view = fleet.keys.get(self.key)
        if view is None or view.value is None or self.mode == "local":
            return
        self.fleet_version = fleet.fleet_version
        parts = view.parts()
        if self.mode == "pooled":
            own = view.own_parts()
            others = parts["sum"] if own is None else parts["sum"] - own["sum"]
            self._fleet = self._tensor(others)
        elif self.mode == "weighted":
            if float(parts["count"]) > 0:  # the failure-weighted mean of the shards' blended EMAs
                mean = self._tensor(parts["sum"] / parts["count"]).to(self.bin_failed_count.dtype)
                self.bin_failed_count.copy_(_finite(mean))
        elif self.shard_id != self.owner:
            self._fleet = self._tensor(parts["value"])
        self._own_at_build.fill_(float("nan"))  # the fleet moved: rebuild at the next sample

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=torch.float64).to(self._fleet.device)


def _mark_resumed(module: nn.Module, incompatible: Any) -> None:
    module.resumed = True


def _finite(t: torch.Tensor) -> torch.Tensor:
    """``t`` with values beyond its dtype's range held at the largest finite value."""
    big = torch.finfo(t.dtype).max
    return torch.nan_to_num(t, nan=0.0, posinf=big, neginf=-big)
