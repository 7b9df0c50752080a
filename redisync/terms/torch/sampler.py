"""The whole-body-tracking adaptive start-frame sampler (BeyondMimic's ``MotionCommand``), synced.

The algorithm, unchanged: one bin per second of motion; each env step the per-bin failure EMA
takes in the bins of the envs that failed, ``ema ← α·current + (1 − α)·ema``; at reset the start
distribution is built from ``ema``, right-padded by ``k − 1`` (replicate) and convolved with the
kernel ``λʲ / Σλʲ``; a bin is drawn, then a uniform offset inside it. The uniform term enters in
one of two ways (``uniform_mix``):

- ``code`` (default, bit-exact with BeyondMimic's code and mjlab's port): ``p ∝ smooth(ema + ε/B)``.
  The uniform share is ``ε / (Σema + ε)``, so it shrinks as the envs feeding the EMA and their
  failures grow: a shard that sees 1/N of the fleet samples flatter than the fleet does.
- ``paper`` (the paper's formula): ``p' = ε/B + (1 − ε)·p`` with ``p = smooth(ema) / Σ``
  (uniform while nothing failed). Every bin keeps at least ``ε/B`` whatever the env count, and
  scaling every failure count by a constant changes nothing.

**Groups.** ``num_frames`` may be a sequence: one motion of a library, or one env profile, per
group, each with bins of its own. The EMA is one flat vector (the groups' bins end to end: the
synced key), and every group's distribution is rebuilt at once on a padded ``[G, max bins]``
grid; nothing loops over groups in Python. Pooling is per bin, so each group is pooled across the
fleet whatever mix of groups each shard runs. `AdaptiveMotionSampler.sample_groups` draws
the group itself, weighted by its failure mass with a uniform floor.

What sync changes is only *which* EMA feeds ``p``:

- ``local``: the shard's own EMA (no sync; the same numbers as the unsynced algorithm);
- ``pooled`` (default): the own-substituted fleet sum of every shard's own EMA — by linearity the
  EMA of the pooled failure counts, i.e. what one unsharded run of all envs would use;
- ``weighted``: the original proposal, kept for comparison: at each reset boundary the shard's EMA is
  overwritten by the failure-weighted mean of the shards' EMAs and keeps evolving locally;
- ``broadcast``: the owner shard's own EMA is everybody's (holosoma's rank-0 semantics).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from ...collector.shared_state import NOT_SHARED, SharedState
from ...store.codec import PullResult
from ...store.schema import KeySpec, Lifecycle
from .. import ema_seam, formulas
from ..role import Role
from ..sampler_options import Mode, SamplerOptions
from .device import DeviceFleet, DeviceReports, copy_counts, on_device
from .ops import TORCH

UniformMix = formulas.UniformMix
DEFAULTS = SamplerOptions()  # the options' defaults, declared once


FPS = 50  # the control rate of the tracking tasks: one bin per second of motion is 50 frames


def frames_for_bins(bins: int, fps: int = FPS) -> int:
    """The motion length in frames whose BeyondMimic ``bin_count`` is exactly ``bins``."""
    return bins * fps - 1


class BinLayout(nn.Module):
    """A `BinGeometry` as non-persistent buffers, so that it moves with
    its sampler (``.to(device)``) and adds nothing to a checkpoint."""

    bins: torch.Tensor
    offsets: torch.Tensor
    real: torch.Tensor
    inverse_bins: torch.Tensor
    last: torch.Tensor
    zero: torch.Tensor

    def __init__(self, bin_counts: Sequence[int], device: torch.device | str | None = None):
        super().__init__()
        geometry = formulas.BinGeometry.of(bin_counts)
        self.bin_counts, self.groups, self.width = geometry.bin_counts, geometry.groups, geometry.width
        self.size, self.ragged = geometry.size, geometry.ragged
        for name in ("bins", "offsets", "real", "inverse_bins", "last", "zero"):
            self.register_buffer(name, torch.as_tensor(getattr(geometry, name), device=device), persistent=False)

    def grid(self, flat: torch.Tensor, pad: int = 0) -> torch.Tensor:
        """A flat per-bin vector on the ``[groups, max bins]`` grid (padded with ``pad``)."""
        out: torch.Tensor = formulas.grid(flat, self, pad, TORCH)
        return out

    def group_sums(self, flat: torch.Tensor) -> torch.Tensor:
        """The sum of a flat per-bin vector over each group's bins."""
        out: torch.Tensor = formulas.group_sums(flat, self, TORCH)
        return out


def grouped_probabilities(
    ema: torch.Tensor, layout: BinLayout, uniform_ratio: float, kernel: torch.Tensor, mix: UniformMix = "code"
) -> torch.Tensor:
    """Every group's start-bin distribution at once from the flat EMA (vectorised, on its device):
    ``[G, width]`` (`redisync.terms.formulas.grouped_probabilities`)."""
    probs: torch.Tensor = formulas.grouped_probabilities(ema, layout, uniform_ratio, kernel, TORCH, mix)
    return probs


def sampling_probabilities(
    ema: torch.Tensor, uniform_ratio: float, kernel: torch.Tensor, mix: UniformMix = "code"
) -> torch.Tensor:
    """One group's start-bin distribution from its failure EMA (BeyondMimic's, for ``mix="code"``)."""
    return grouped_probabilities(ema, _one_group(ema.numel(), str(ema.device)), uniform_ratio, kernel, mix)[0]


@functools.lru_cache(maxsize=64)
def _one_group(bins: int, device: str) -> BinLayout:
    return BinLayout((bins,), device)


class AdaptiveMotionSampler(nn.Module):
    """Adaptive start-frame sampling for one shard's envs, optionally synced through the store.

    Call `record_failures` once per env step with the time steps and failure flags of the
    envs being reset, `step` once per env step, and `sample` for the new start frames.
    With a sequence of ``num_frames`` (groups), pass each env's group to both.

    Args:
        num_frames: the motion's length in frames, or one length per group (motions or profiles).
        step_dt: the env step in seconds; a bin is one second of motion.
        mode: `redisync.terms.sampler_options.SamplerOptions.mode` (the options of both samplers, declared once).
        key: `redisync.terms.sampler_options.SamplerOptions.key`.
        shard_id: `redisync.terms.sampler_options.SamplerOptions.shard_id`.
        owner: `redisync.terms.sampler_options.SamplerOptions.owner`.
        alpha: `redisync.terms.sampler_options.SamplerOptions.alpha`.
        uniform_ratio: `redisync.terms.sampler_options.SamplerOptions.uniform_ratio`.
        uniform_mix: `redisync.terms.sampler_options.SamplerOptions.uniform_mix`.
        group_uniform_ratio: `redisync.terms.sampler_options.SamplerOptions.group_uniform_ratio`.
        group_names: `redisync.terms.sampler_options.SamplerOptions.group_names`.
        worst_groups: `redisync.terms.sampler_options.SamplerOptions.worst_groups`.
        kernel_size: `redisync.terms.sampler_options.SamplerOptions.kernel_size`.
        kernel_lambda: `redisync.terms.sampler_options.SamplerOptions.kernel_lambda`.
        stale_after_s: `redisync.terms.sampler_options.SamplerOptions.stale_after_s`.
        lifecycle: `redisync.terms.sampler_options.SamplerOptions.lifecycle`.
        lease_grace_s: `redisync.terms.sampler_options.SamplerOptions.lease_grace_s`.
        rebuild_tol: `redisync.terms.sampler_options.SamplerOptions.rebuild_tol`.
        fleet_shards: `redisync.terms.sampler_options.SamplerOptions.fleet_shards`.
        device: where the buffers live.
        dtype: the EMA's dtype (the fleet part is float64 whatever it is).
    """

    # buffers (they move with the module and the persistent ones are in its checkpoint)
    kernel: torch.Tensor
    bin_failed_count: torch.Tensor  # the OWN failure EMA
    _current_bin_failed: torch.Tensor
    _fleet: torch.Tensor
    _own_at_build: torch.Tensor
    _frames: torch.Tensor
    _probs: torch.Tensor
    _device_failures: torch.Tensor

    def __init__(
        self,
        num_frames: int | Sequence[int],
        step_dt: float,
        *,
        mode: Mode = DEFAULTS.mode,
        key: str = DEFAULTS.key,
        shard_id: int = DEFAULTS.shard_id,
        owner: int = DEFAULTS.owner,
        alpha: float = DEFAULTS.alpha,
        uniform_ratio: float = DEFAULTS.uniform_ratio,
        uniform_mix: UniformMix = DEFAULTS.uniform_mix,
        group_uniform_ratio: float = DEFAULTS.group_uniform_ratio,
        group_names: Sequence[str] | None = DEFAULTS.group_names,
        worst_groups: int = DEFAULTS.worst_groups,
        kernel_size: int = DEFAULTS.kernel_size,
        kernel_lambda: float = DEFAULTS.kernel_lambda,
        stale_after_s: float | None = DEFAULTS.stale_after_s,
        lifecycle: Lifecycle = DEFAULTS.lifecycle,
        lease_grace_s: float | None = DEFAULTS.lease_grace_s,
        rebuild_tol: float = DEFAULTS.rebuild_tol,
        fleet_shards: int | None = DEFAULTS.fleet_shards,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.grouped = not isinstance(num_frames, int)
        frames = (int(num_frames),) if isinstance(num_frames, int) else tuple(int(f) for f in num_frames)
        self.options = SamplerOptions.of(locals())  # the options among the arguments
        self.options.check(frames, step_dt)
        self.mode, self.key, self.shard_id, self.owner = mode, key, shard_id, owner
        self.role = self.options.role
        self.frame_counts = frames
        self.num_frames: int | tuple[int, ...] = frames if self.grouped else frames[0]
        self.alpha, self.uniform_ratio, self.uniform_mix = alpha, uniform_ratio, uniform_mix
        self.group_uniform_ratio, self.worst_groups = group_uniform_ratio, worst_groups
        self.stale_after_s, self.lifecycle, self.lease_grace_s = stale_after_s, lifecycle, lease_grace_s
        self.group_names = self.options.names(len(frames))
        self.rebuild_tol = self.options.tolerance
        self.bin_counts = formulas.bin_counts_of(frames, step_dt)
        self.groups = len(frames)
        self.bin_count = sum(self.bin_counts)  # the flat EMA's length: the synced key's
        self.layout = BinLayout(self.bin_counts, device)
        self._watch = formulas.EmaWatch(
            self.options.role, uniform_mix, alpha, uniform_ratio, self.bin_counts, fleet_shards
        )
        kernel = torch.tensor([kernel_lambda**i for i in range(kernel_size)], device=device, dtype=dtype)
        self.register_buffer("kernel", kernel / kernel.sum())  # in the sampler's dtype, as BeyondMimic's
        self.register_buffer("bin_failed_count", torch.zeros(self.bin_count, device=device, dtype=dtype))
        self.register_buffer(
            "_current_bin_failed", torch.zeros(self.bin_count, device=device, dtype=dtype), persistent=False
        )
        # the rest of the fleet as last applied (pooled), or the fleet value (broadcast)
        self.register_buffer(
            "_fleet", torch.zeros(self.bin_count, device=device, dtype=torch.float64), persistent=False
        )
        self.register_buffer(
            "_own_at_build", torch.full((self.bin_count,), float("nan"), device=device, dtype=dtype), persistent=False
        )
        self._fleet_view: Any = None  # the last fleet view applied, not yet read (see apply_shard_state)
        self._fleet_moved = True  # the fleet part changed since the last rebuild
        self.register_buffer("_frames", torch.tensor(frames, device=device), persistent=False)
        self.register_buffer(
            "_probs", torch.zeros(self.groups, self.layout.width, device=device, dtype=dtype), persistent=False
        )
        self._cdf: torch.Tensor | None = None
        self._failures_since_report = 0.0
        # on a CUDA device: a running total of the failures kept on the device (a weighted report counts
        # what it added), and the copies each way through pinned memory (redisync.terms.torch.device)
        self.register_buffer("_device_failures", torch.zeros((), device=device, dtype=torch.float64), persistent=False)
        self._failures_handed = 0.0  # the device's running total as of the last report handed over
        self._device_reports: DeviceReports | None = None
        self._device_fleet: DeviceFleet | None = None
        self._fleet_version = 0
        self.rebuilds = 0
        self._shared: Any = NOT_SHARED  # brackets the writes to the own EMA once it lives in shared memory
        self._received: Any = NOT_SHARED  # the version of the fleet part once it is received in shared memory
        self._received_at_build = 0
        # loading a checkpoint restores the own EMA: this process then resumes its previous life's slot
        self.resumed = False
        self.register_load_state_dict_post_hook(_mark_resumed)  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    # ------------------------------------------------------------------ the algorithm

    def bin_of(self, time_steps: torch.Tensor, group_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Each time step's bin inside its group (BeyondMimic's ``t·B // T``, clamped)."""
        if group_ids is None:
            self._single_group("bin_of")
            one: torch.Tensor = formulas.bin_of(time_steps, self.bin_counts[0], max(self.frame_counts[0], 1), TORCH)
            return one
        g = self._checked_groups(group_ids, time_steps.shape[0])
        bins: torch.Tensor = formulas.bin_of(time_steps, self.layout.bins[g], self._frames[g].clamp(min=1), TORCH)
        return bins

    def record_failures(
        self, time_steps: torch.Tensor, failed: torch.Tensor, group_ids: torch.Tensor | None = None
    ) -> None:
        """At reset (once per env step, every env being reset at once): the bins in which the reset
        envs failed become this step's failure counts."""
        if on_device(failed):  # no branch on a device value, no boolean indexing (both wait for the device)
            flat = self.bin_of(time_steps, group_ids)
            if group_ids is not None:
                flat = flat + self.layout.offsets[torch.as_tensor(group_ids, device=flat.device).long()]
            # (not bincount: on a device it reads the largest bin back to size its output)
            counts = torch.zeros(self.bin_count, device=flat.device, dtype=torch.float64)
            counts.index_add_(0, flat, failed.to(torch.float64))
            self._current_bin_failed.copy_(counts)
            if self.role is Role.WEIGHS:
                self._device_failures += counts.sum()
            return
        if torch.any(failed):
            flat = self.bin_of(time_steps, group_ids)
            if group_ids is not None:
                flat = flat + self.layout.offsets[torch.as_tensor(group_ids, device=flat.device).long()]
            counts = torch.bincount(flat[failed], minlength=self.bin_count)
            self._current_bin_failed[:] = counts
            if self.role is Role.WEIGHS:
                self._failures_since_report += float(counts.sum())

    def step(self) -> None:
        """Once per env step: fold this step's failures into the own EMA."""
        self._watch.steps += 1
        self._shared.begin()
        try:
            formulas.ema_step(self.bin_failed_count, self._current_bin_failed, self.alpha)
        finally:
            self._shared.end()
        self._current_bin_failed.zero_()

    def set_own_ema(self, value: torch.Tensor) -> None:
        """Overwrite the own EMA (a framework that assigns it, a test)."""
        self._shared.begin()
        try:
            self.bin_failed_count.copy_(value)
        finally:
            self._shared.end()

    def pooled_ema(self) -> torch.Tensor | None:
        """The pooled EMA at this moment (the others' sum as last applied, plus the own EMA of now),
        where this shard pools or observes; None otherwise."""
        if not self.role.pools:
            return None
        return self._fleet_ema() + self.bin_failed_count.to(torch.float64)

    def sampling_ema(self) -> torch.Tensor:
        """The EMA that decides the start distribution, per mode (the fleet part is float64, so a
        fleet value beyond the sampler's dtype stays finite)."""
        if self.role is Role.POOLS:
            return self._fleet_ema() + self.bin_failed_count.to(torch.float64)
        if ema_seam.follows_fleet(self.role):  # a broadcast's receiver
            return self._fleet_ema()
        return self.bin_failed_count

    def probabilities(self) -> torch.Tensor:
        """The start-bin distribution: ``[bins]``, or ``[groups, max bins]`` (zero past a group's
        bins) for a grouped sampler. Rebuilt only when some group's could have moved by more than
        ``rebuild_tol``."""
        if self._needs_rebuild():
            self._rebuild()
        return self._probs if self.grouped else self._probs[0]

    @property
    def fleet_version(self) -> int:
        """The version of the fleet state this sampler holds (0: none yet)."""
        version: int = max(self._fleet_version, self._received.applied)
        return version

    def _needs_rebuild(self) -> bool:
        if self._fleet_moved or self._received.applied != self._received_at_build:
            return True
        if on_device(self.bin_failed_count):  # judging the move would wait for the device: rebuilt
            return True
        own, built = self.bin_failed_count, self._own_at_build
        if self.rebuild_tol == 0:
            return not torch.equal(own, built)
        if self.groups == 1:  # scalars: the cheapest check on the collector's reset path
            total = float((own - built).abs().sum())
            return not total <= self.rebuild_tol * (float(self.sampling_ema().sum()) + self.uniform_ratio)
        moved: bool = formulas.moved_beyond(
            built, own, self.layout, self.rebuild_tol, self.uniform_ratio, TORCH, scale=self.sampling_ema()
        )
        return moved

    def _rebuild(self) -> None:
        self._probs = self._distributions(self.sampling_ema())
        self._cdf = None
        self._own_at_build = self.bin_failed_count.clone()
        self._fleet_moved = False
        self._received_at_build = self._received.applied
        self.rebuilds += 1

    def _distributions(self, ema: torch.Tensor) -> torch.Tensor:
        """``[groups, max bins]`` distributions of a flat EMA, in the sampler's dtype."""
        return grouped_probabilities(ema, self.layout, self.uniform_ratio, self.kernel, self.uniform_mix).to(
            self.bin_failed_count.dtype
        )

    def sample(
        self, n: int, group_ids: torch.Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Start time steps for ``n`` envs (of groups ``group_ids``): a bin from the group's
        distribution, then a uniform offset inside it."""
        bins = self.sample_bins(n, group_ids, generator=generator)
        offset = torch.rand(n, device=bins.device, dtype=self._probs.dtype, generator=generator)
        if group_ids is None:
            return ((bins + offset) / self.bin_count * (self.frame_counts[0] - 1)).long()
        g = torch.as_tensor(group_ids, device=bins.device).long()
        return ((bins + offset) / self.layout.bins[g] * (self._frames[g] - 1)).long()

    def sample_bins(
        self, n: int, group_ids: torch.Tensor | None = None, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Start bins for ``n`` envs, each inside its group (the first half of `sample`)."""
        probs = self.probabilities()
        if group_ids is None:
            self._single_group("sample")
            return torch.multinomial(probs.view(-1)[: self.bin_count], n, replacement=True, generator=generator)
        g = self._checked_groups(group_ids, n)
        if self._cdf is None:
            # every row's CDF shifted by its group id: one sorted sequence, searched once for all envs
            # each row ends at exactly 1 (c / c[-1]), so no row reaches into the next one's range
            # however its float32 probabilities round (they may sum to 1 + 3e-8)
            rows = torch.arange(self.groups, device=probs.device, dtype=torch.float64).unsqueeze(1)
            cdf = self._probs.to(torch.float64).cumsum(dim=1)
            self._cdf = (cdf / cdf[:, -1:] + rows).view(-1)
        u = torch.rand(n, device=probs.device, dtype=torch.float64, generator=generator)
        column = torch.searchsorted(self._cdf, u + g, right=True) - g * self.layout.width
        return torch.minimum(column, self.layout.bins[g] - 1).clamp(min=0)

    def group_probabilities(self) -> torch.Tensor:
        """The distribution over groups: each group's failure mass, mixed with a uniform floor
        ``group_uniform_ratio / G`` (the paper's form, so it does not depend on the env count)."""
        mass = self.layout.group_sums(self.sampling_ema().to(torch.float64))
        weights: torch.Tensor = formulas.group_weights(mass, self.group_uniform_ratio, self.groups, TORCH)
        return weights.to(self.bin_failed_count.dtype)

    def sample_groups(self, n: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """Groups for ``n`` envs (a motion library's motion draw), from `group_probabilities`."""
        return torch.multinomial(self.group_probabilities(), n, replacement=True, generator=generator)

    def metrics(self) -> dict[str, float]:
        """BeyondMimic's sampling metrics; the drift of the own distribution from the pooled one at
        this moment (pooled, observe) or from the one used; for groups, their mean and extreme over
        groups and the few worst groups (not one per group); an ``observe`` sampler's mean measured
        drift, and its warning (`EmaWatch.measured`)."""
        used = self.probabilities().view(self.groups, -1)
        own = self._distributions(self.bin_failed_count)
        pooled = self.pooled_ema()  # (pooled or observing: drift is the distance from pooled, now)
        reference = used if pooled is None else self._distributions(pooled)
        drift = 0.5 * (own - reference).abs().sum(dim=1)
        out = _summary(used, self.layout.bins, drift, self.group_names if self.grouped else None, self.worst_groups)
        measured = self._watch.measured(float(drift.mean()), self.fleet_version > 0)
        return {
            **out,
            **measured,
            **self._watch.metrics(self._group_masses()),
        }  # (and, once, a local sampler's warning)

    def ema_statistics(self, pooled_with: Sequence[AdaptiveMotionSampler] = ()) -> dict[str, float]:
        """The own failure EMA's statistics for its worst group (`statistics`);
        with ``pooled_with`` (samplers of the same layout, this one among them or not), those of the
        sum of their own EMAs and this one's: what a pooled EMA of them holds."""
        masses = self._group_masses()
        for other in pooled_with:
            if other is not self:
                masses = [a + b for a, b in zip(masses, other._group_masses(), strict=True)]
        return self._watch.statistics(masses)

    def _group_masses(self) -> list[float]:
        masses: list[float] = self.layout.group_sums(self.bin_failed_count.to(torch.float64)).tolist()
        return masses

    def fleet_probabilities(self, fleet: PullResult) -> torch.Tensor | None:
        """What the fleet samples, from a learner's view of the key (``FleetMonitor.state``): the
        pooled sum, the broadcast value or the weighted mean; None when there is nothing yet."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None:
            return None
        parts = view.parts()
        if "value" in parts:
            ema = parts["value"]
        elif self.role is Role.WEIGHS:
            ema = parts["sum"] / parts["count"] if float(parts["count"]) > 0 else np.zeros(self.bin_count)
        else:
            ema = parts["sum"]
        probs = self._distributions(self._tensor(ema))
        return probs if self.grouped else probs[0]

    def fleet_metrics(self, fleet: PullResult) -> dict[str, float]:
        """The learner's per-group view of the fleet's distributions, summarised like `metrics`."""
        probs = self.fleet_probabilities(fleet)
        if probs is None:
            return {}
        out = _summary(
            probs.view(self.groups, -1),
            self.layout.bins,
            None,
            self.group_names if self.grouped else None,
            self.worst_groups,
        )
        return {f"redisync/{self.key}/{name}": value for name, value in out.items()}

    def _single_group(self, what: str) -> None:
        if self.groups > 1:
            raise ValueError(f"{what}: this sampler has {self.groups} groups; pass group_ids (one per env)")

    def _checked_groups(self, group_ids: torch.Tensor, n: int) -> torch.Tensor:
        g = torch.as_tensor(group_ids, device=self._frames.device).long()
        if g.shape != (n,):
            raise ValueError(f"group_ids must have shape ({n},), one group per env; got {tuple(g.shape)}")
        if n and bool(((g < 0) | (g >= self.groups)).any()):
            raise ValueError(
                f"group_ids must lie in [0, {self.groups}); got values in [{int(g.min())}, {int(g.max())}]"
            )
        return g

    # ------------------------------------------------------------------ the seam

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        return ema_seam.declared(
            self.role,
            self.key,
            self.bin_count,
            owner=self.owner,
            stale_after_s=self.stale_after_s,
            lifecycle=self.lifecycle,
            lease_grace_s=self.lease_grace_s,
            groups=self.groups,
        )

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if on_device(self.bin_failed_count):
            return self._device_report(settle=False)
        own = self.bin_failed_count.to("cpu", torch.float64, copy=True).numpy()  # one op: this runs on the hot path
        count = 1.0
        if self.role is Role.WEIGHS:
            count, self._failures_since_report = self._failures_since_report, 0.0
        drift = None
        if self.role is Role.OBSERVES and self.fleet_version > 0:
            drift = self._measured_drift().numpy()
        return ema_seam.report(self.role, self.key, own, count=count, drift=drift)

    def _measured_drift(self) -> torch.Tensor:
        """An observing shard's drift per group, on the term's device (float64): the TV distance of
        its own distribution from the pooled one at this moment (the studies' records' definition).
        Device kernels only: nothing is read back."""
        pooled = self.pooled_ema()
        assert pooled is not None
        measured = 0.5 * (self._distributions(self.bin_failed_count) - self._distributions(pooled)).abs().sum(dim=1)
        return measured.to(torch.float64)

    def prepare(self) -> None:
        """On a CUDA device: the pinned buffers of its copies made now (the syncer's start), not at
        the first report or boundary, on the hot path."""
        if on_device(self.bin_failed_count) and self.role.syncs:
            self._copies_in()
            if self.role.reports:
                self._copies_out()

    def _copies_out(self) -> DeviceReports:
        """The device-to-host copies of its reports: [failures so far, the own EMA], and observing,
        the drift measured per group (NaN before a fleet state arrived)."""
        if self._device_reports is None:
            measured = self.groups if self.role is Role.OBSERVES else 0
            self._device_reports = DeviceReports(self.bin_count + 1 + measured)
        return self._device_reports

    def _copies_in(self) -> DeviceFleet:
        """The host-to-device copies of the fleet part."""
        if self._device_fleet is None:
            self._device_fleet = DeviceFleet(self.bin_count)
        return self._device_fleet

    def device_copies(self) -> dict[str, int]:
        """What the device copies of this term left undone (`copy_counts`)."""
        return copy_counts(self._device_reports, self._device_fleet)

    def settle(self) -> Mapping[str, Mapping[str, Any]]:
        """The current report, waiting for the device where the term lives on one: what a flush or a
        stop hands over (the syncers call it there, never on the hot path)."""
        if on_device(self.bin_failed_count):
            return self._device_report(settle=True)
        return self.report_shard_state()

    def _device_report(self, settle: bool) -> Mapping[str, Mapping[str, Any]]:
        """On a CUDA device: [failures so far (weighted), the own EMA] copied to the host
        without waiting (`DeviceReports`): the newest copy that has
        landed, or nothing before the first has. An observing shard's measured drift is computed
        by device kernels and travels in the same copy."""
        if not self.role.reports:
            return {}
        parts = [self._device_failures.view(1), self.bin_failed_count.to(torch.float64)]
        observing = self.role is Role.OBSERVES
        if observing:
            arrived = self.fleet_version > 0  # (a host number)
            parts.append(self._measured_drift() if arrived else self._device_failures.new_full((self.groups,), np.nan))
        source = torch.cat(parts)
        reports = self._copies_out()
        got = reports.settle(source) if settle else reports.report(source)
        if got is None:
            return {}
        count = 1.0
        if self.role is Role.WEIGHS:  # the device keeps a running total: a report counts what it adds
            count, self._failures_handed = float(got[0]) - self._failures_handed, float(got[0])
        own, measured = got[1 : 1 + self.bin_count], got[1 + self.bin_count :]
        drift = measured if observing and not np.isnan(measured).any() else None
        return ema_seam.report(self.role, self.key, own, count=count, drift=drift)

    def __getstate__(self) -> dict[str, Any]:
        # a copy (deepcopy, pickle) keeps its own memory: it is not the shared term
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return state | {"_shared": NOT_SHARED, "_received": NOT_SHARED, "_device_reports": None, "_device_fleet": None}

    def share_report(self, shared: SharedState) -> bool:
        """The process worker's fast path: the own EMA moves to shared memory, where the sidecar
        reads it when a publish is due (pooled, or the broadcast owner, on the CPU; nothing to share
        when the sampler reports nothing)."""
        if not self.role.reports:
            return True  # nothing to report
        if self.role is Role.WEIGHS or self.bin_failed_count.device.type != "cpu":
            return False  # weighted reports the failures since its last report: not a slice of its state
        self.bin_failed_count = torch.from_numpy(shared.array(self.bin_failed_count.numpy()))
        own = self.bin_failed_count.numpy()
        if self.role.pools:
            shared.report(self.key, count=1.0, sum=own)
        else:
            shared.report(self.key, value=own)
        self._shared = shared
        return True

    def share_fleet(self, shared: SharedState) -> bool:
        """The process worker's fast path: the fleet part (the others' pooled EMA, or the owner's)
        is an array the reset boundary updates in place; the next sample rebuilds from it."""
        if self.role is Role.WEIGHS or self._fleet.device.type != "cpu":
            return False  # weighted blends the fleet into the own EMA when it arrives: it needs the hand-over
        if self.role.pools:
            self._fleet = torch.from_numpy(shared.receive(self.key, "sum"))
        elif self.role is Role.FOLLOWS:
            self._fleet = torch.from_numpy(shared.receive(self.key, "value"))
        self._received = shared  # local and the broadcast owner receive nothing
        return True

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take the fleet's EMA in. A pooled or broadcast view is only kept here and turned into a
        tensor when the sampler next reads it (`sampling_ema`, at the next sample): the reset
        boundary that calls this stays a swap."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None or not self.role.syncs:
            return
        if on_device(self._fleet):
            self._apply_on_device(view, fleet.fleet_version)
            return
        self._fleet_version = fleet.fleet_version
        if self.role is Role.WEIGHS:
            parts = view.parts()
            if float(parts["count"]) > 0:  # the failure-weighted mean of the shards' blended EMAs
                mean = self._tensor(parts["sum"] / parts["count"]).to(self.bin_failed_count.dtype)
                self.set_own_ema(_finite(mean))
        elif self.role.reads_fleet:  # pooled, a broadcast's receiver, or observing
            self._fleet_view = view
        self._fleet_moved = self.role is not Role.OBSERVES  # rebuild at the next sample (an observer samples its own)

    def _apply_on_device(self, view: Any, version: int) -> None:
        """On a CUDA device, at the reset boundary: the fleet part queued into the device from pinned
        memory, and the distributions rebuilt after it by device kernels, in stream order; nothing
        waits for the device. (A fleet state whose buffers are all still being copied waits for the
        next boundary.)"""
        fleet = self._copies_in()
        if self.role is Role.WEIGHS:
            parts = view.parts()
            if float(parts["count"]) <= 0:  # (host numbers: the view is on the host)
                return
            mean = np.asarray(parts["sum"] / parts["count"], dtype=np.float64)
            if not fleet.copy(mean, self._fleet):
                return
            self.set_own_ema(_finite(self._fleet.to(self.bin_failed_count.dtype)))
        else:
            if not fleet.copy(ema_seam.fleet_part(self.role, view), self._fleet):
                return
        self._fleet_version = version
        self._fleet_view = None
        self._rebuild()

    def _fleet_ema(self) -> torch.Tensor:
        """The fleet part of the EMA (the other shards' sum, or the owner's), from the last view applied."""
        view, self._fleet_view = self._fleet_view, None
        if view is not None:
            self._fleet = self._tensor(ema_seam.fleet_part(self.role, view))
        return self._fleet

    def _tensor(self, array: NDArray[Any]) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=torch.float64).to(self._fleet.device)


def _summary(
    probs: torch.Tensor, bins: torch.Tensor, drift: torch.Tensor | None, names: Sequence[str] | None, worst: int
) -> dict[str, float]:
    """`formulas.distribution_summary` of tensors (read back once, in float64)."""
    return formulas.distribution_summary(
        probs.to("cpu", torch.float64).numpy(),
        bins.cpu().numpy(),
        None if drift is None else drift.to("cpu", torch.float64).numpy(),
        names,
        worst,
    )


def _mark_resumed(module: AdaptiveMotionSampler, incompatible: Any) -> None:
    module.resumed = True


def _finite(t: torch.Tensor) -> torch.Tensor:
    """``t`` with values beyond its dtype's range held at the largest finite value."""
    big = torch.finfo(t.dtype).max
    return torch.nan_to_num(t, nan=0.0, posinf=big, neginf=-big)
