"""The adaptive start-frame sampler for numpy (and numba) environments, synced.

The same algorithm as `redisync.terms.torch.AdaptiveMotionSampler` — its formulas are
`redisync.terms.formulas`, shared with the torch term — for an environment whose state is numpy
arrays that compiled kernels read. Such an environment cannot have its arrays rebound (a kernel
holds the old one), so the sampler writes into arrays the caller owns, **in place**:

- ``ema``: the shard's own failure EMA (``[bins]``; what the shard reports), folded by `step`
  or by the caller's own kernel — either way the sampler reads it where it lies;
- ``cdf``: the start-bin CDF per group (``[G, width]``, or ``[bins]`` for one motion), rebuilt by
  `rebuild` from the EMA the mode chooses, for a kernel that draws from it.

Arrays the caller does not pass are the sampler's own (float32 unless ``dtype`` says otherwise).
Modes, options and metrics are the torch sampler's (`redisync.terms.sampler_options`): ``local``
(the shard's own EMA: the unsynced algorithm), ``pooled`` (the fleet's summed EMA: what one
unsharded sampler fed every shard's failures would use, up to float32), ``weighted`` (the
failure-weighted mean of the shards' EMAs, written into ``ema`` at each reset boundary) and
``broadcast`` (the owner shard's EMA); ``observe`` samples from the shard's own EMA as ``local`` does,
reports and reads as ``pooled`` does, and measures the distance between the two.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...errors import InvalidSchema
from ...store.codec import PullResult
from ...store.schema import KeySpec, Lifecycle
from .. import ema_seam, formulas
from ..role import Role, role_of
from ..sampler_options import MODES, Mode, SamplerOptions

DEFAULTS = SamplerOptions()  # the options' defaults, declared once


class FailureEma:
    """A shard's failure EMA as a synced term: the own array (the caller's, read where it lies) and
    the fleet's part as last applied. What a sampler — this package's, or an environment's own —
    builds its distribution from is `sampling_ema`, per mode. In ``weighted`` mode the caller
    counts its failures with `count_failures` (each report carries those since the last one) and
    the fleet's failure-weighted mean is written into the own array at the reset boundary."""

    def __init__(
        self,
        own: NDArray[Any],
        *,
        mode: Mode = DEFAULTS.mode,
        key: str = DEFAULTS.key,
        shard_id: int = DEFAULTS.shard_id,
        owner: int = DEFAULTS.owner,
        stale_after_s: float | None = DEFAULTS.stale_after_s,
        lifecycle: Lifecycle = DEFAULTS.lifecycle,
        lease_grace_s: float | None = DEFAULTS.lease_grace_s,
    ):
        if mode not in MODES:
            raise InvalidSchema(f"sampler mode must be one of {MODES}, got {mode!r}")
        self.own, self.mode, self.key, self.shard_id, self.owner = own, mode, key, shard_id, owner
        self.role = role_of(mode, leads=shard_id == owner)
        self.stale_after_s, self.lifecycle, self.lease_grace_s = stale_after_s, lifecycle, lease_grace_s
        self._fleet = np.zeros(own.shape, dtype=np.float64)  # the others' summed EMA, or the owner's
        self._fleet_view: Any = None
        self.fleet_version = 0
        self._failures_since_report = 0.0

    def count_failures(self, failures: float) -> None:
        """Add failures seen since the last report (what a ``weighted`` report is weighted by)."""
        self._failures_since_report += float(failures)

    @property
    def follows_fleet(self) -> bool:
        """Whether the EMA sampled from is not the own one (pooled, or a broadcast's receiver)."""
        return ema_seam.follows_fleet(self.role)

    def pooled_ema(self) -> NDArray[Any] | None:
        """The pooled EMA at this moment (the others' sum as last applied, plus the own EMA of now),
        where this shard pools or observes; None otherwise."""
        if not self.role.pools:
            return None
        self._take_view()
        pooled: NDArray[Any] = self._fleet + self.own
        return pooled

    def sampling_ema(self) -> NDArray[Any]:
        """The EMA the start distribution is built from, per mode (float64 when it holds the fleet's part)."""
        self._take_view()
        ema: NDArray[Any] = (
            self._fleet + self.own if self.role is Role.POOLS else (self._fleet if self.follows_fleet else self.own)
        )
        return ema

    def write_sampling_ema(self, out: NDArray[Any]) -> None:
        """`sampling_ema` written into ``out`` in place (the caller's dtype, held at its largest
        finite value): for a kernel that builds the distribution itself."""
        big = np.finfo(out.dtype).max
        np.copyto(out, np.clip(self.sampling_ema(), -big, big), casting="unsafe")

    def schema_entries(self, groups: int = 1) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`); ``groups``: how many
        drift values an observing shard reports."""
        shape = self.own.shape if self.own.ndim > 1 else self.own.size
        return ema_seam.declared(
            self.role,
            self.key,
            shape,
            owner=self.owner,
            stale_after_s=self.stale_after_s,
            lifecycle=self.lifecycle,
            lease_grace_s=self.lease_grace_s,
            groups=groups,
        )

    def report_shard_state(self, drift: NDArray[np.float64] | None = None) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`), with an observing
        shard's measured ``drift``."""
        own = self.own.astype(np.float64)  # a copy: the caller's kernel keeps writing the array
        count = 1.0
        if self.role is Role.WEIGHS:
            count, self._failures_since_report = self._failures_since_report, 0.0
        return ema_seam.report(self.role, self.key, own, count=count, drift=drift)

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Keep the fleet's view; it becomes an array when the EMA is next read (the reset boundary
        that calls this stays a swap)."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None:
            return
        if self.role is Role.WEIGHS:  # the failure-weighted mean of the shards' blended EMAs, in place
            parts = view.parts()
            if float(parts["count"]) > 0:
                big = float(np.finfo(self.own.dtype).max)
                mean = np.nan_to_num(parts["sum"] / parts["count"], nan=0.0, posinf=big, neginf=-big)
                np.copyto(self.own, mean.reshape(self.own.shape), casting="unsafe")
                self.fleet_version = fleet.fleet_version
        elif self.role.reads_fleet:  # pooled, a broadcast's receiver, or observing
            self._fleet_view, self.fleet_version = view, fleet.fleet_version

    def _take_view(self) -> None:
        view, self._fleet_view = self._fleet_view, None
        if view is not None:
            self._fleet = ema_seam.fleet_part(self.role, view).reshape(self.own.shape)


class AdaptiveMotionSampler:
    """Adaptive start-frame sampling for one shard's envs, on numpy arrays the caller may own.

    Its synced state is a `FailureEma` over ``ema`` (``state``).
    Per env step: `record_failures` (at reset, the envs that failed) and `step` (the EMA
    fold); before drawing: `rebuild` (or `sample`, which rebuilds when the EMA it uses
    moved by more than ``rebuild_tol``). With a sequence of ``num_frames`` (groups: motions of a
    library, env profiles), pass each env's group. `metrics` gives the torch sampler's metrics:
    the distributions' entropy, top bin and drift, and the EMA's statistics (`EmaWatch`).

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
        dtype: the EMA's dtype, when the sampler allocates it (the fleet part is float64).
        ema: the own failure EMA, ``[bins]``, the caller's array written in place (a kernel's).
        cdf: the start-bin CDF, ``[G, width]`` or ``[bins]``, the caller's array written in place.
    """

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
        uniform_mix: formulas.UniformMix = DEFAULTS.uniform_mix,
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
        dtype: Any = np.float32,
        ema: NDArray[Any] | None = None,
        cdf: NDArray[Any] | None = None,
    ):
        self.grouped = not isinstance(num_frames, (int, np.integer))
        frames = (int(num_frames),) if isinstance(num_frames, (int, np.integer)) else tuple(int(f) for f in num_frames)
        self.options = SamplerOptions.of(locals())  # the options among the arguments
        self.options.check(frames, step_dt)
        self.mode = mode
        self.alpha, self.uniform_ratio, self.uniform_mix = alpha, uniform_ratio, uniform_mix
        self.group_uniform_ratio, self.worst_groups = group_uniform_ratio, worst_groups
        self.group_names = self.options.names(len(frames))
        self.rebuild_tol = self.options.tolerance
        self.frame_counts = np.asarray(frames, dtype=np.int64)
        self.geometry = formulas.BinGeometry.of(formulas.bin_counts_of(frames, step_dt))
        self.bin_count, self.groups, self.width = self.geometry.size, self.geometry.groups, self.geometry.width
        bins = formulas.bin_counts_of(frames, step_dt)
        self._watch = formulas.EmaWatch(self.options.role, uniform_mix, alpha, uniform_ratio, bins, fleet_shards)
        dtype = np.dtype(dtype if ema is None else ema.dtype)
        self.ema = _caller_array(ema, (self.bin_count,), dtype, "ema")
        grid = (self.groups, self.width) if self.grouped else (self.bin_count,)
        self.cdf = _caller_array(cdf, grid, dtype, "cdf")
        self.current = np.zeros(self.bin_count, dtype=dtype)  # this step's failures per bin
        self.kernel = formulas.smoothing_kernel(kernel_size, kernel_lambda, dtype)
        self.state = FailureEma(
            self.ema,
            mode=mode,
            key=key,
            shard_id=shard_id,
            owner=owner,
            stale_after_s=stale_after_s,
            lifecycle=lifecycle,
            lease_grace_s=lease_grace_s,
        )
        self._built_from: NDArray[Any] | None = None
        self.rebuilds = 0
        self.rebuild()

    # ------------------------------------------------------------------ the algorithm

    def bin_of(self, time_steps: NDArray[Any], group_ids: NDArray[Any] | None = None) -> NDArray[Any]:
        """Each time step's bin inside its group (BeyondMimic's ``t·B // T``, clamped)."""
        t = np.asarray(time_steps, dtype=np.int64)
        g = self._groups_of(group_ids, t.shape[0])
        bins: NDArray[Any] = formulas.bin_of(
            t, self.geometry.bins[g], np.maximum(self.frame_counts[g], 1), formulas.NUMPY
        )
        return bins

    def record_failures(
        self, time_steps: NDArray[Any], failed: NDArray[Any], group_ids: NDArray[Any] | None = None
    ) -> None:
        """At reset: add the bins in which the reset envs failed to this step's failure counts (a
        reset called more than once in a step adds up, as holosoma's does)."""
        failed = np.asarray(failed, dtype=bool)
        if np.shape(time_steps) != failed.shape or failed.ndim != 1:
            raise ValueError(
                f"record_failures: time_steps and failed must be 1-D of one length (one per reset env); "
                f"got shapes {np.shape(time_steps)} and {failed.shape}"
            )
        if failed.any():
            g = self._groups_of(group_ids, failed.shape[0])
            flat = self.bin_of(time_steps, group_ids) + self.geometry.offsets[g]
            self.current += np.bincount(flat[failed], minlength=self.bin_count).astype(self.current.dtype)
            if self.state.role is Role.WEIGHS:
                self.state.count_failures(int(failed.sum()))

    def step(self) -> None:
        """Once per env step: fold this step's failures into the own EMA (in place) and clear them."""
        formulas.ema_step(self.ema, self.current, self.alpha)
        self.current[:] = 0
        self._watch.steps += 1

    def metrics(self) -> dict[str, float]:
        """BeyondMimic's sampling metrics; the drift of the own distribution from the pooled one at
        this moment (pooled, observe) or from the one used (for groups: their mean and extreme, and
        the few worst groups); the own failure EMA's statistics (`EmaWatch`); an ``observe`` sampler's
        mean measured drift. A ``local`` sampler whose EMA is a poor guide warns once, an ``observe``
        one whose measured drift is as large as where unsynced shards trained worse."""
        used = np.asarray(self.probabilities(), dtype=np.float64).reshape(self.groups, self.width)
        own = self._distributions(self.ema)
        pooled = self.state.pooled_ema()  # (pooled or observing: drift is the distance from pooled, now)
        reference = used if pooled is None else self._distributions(pooled)
        drift = 0.5 * np.abs(own - reference).sum(axis=1)
        names = self.group_names if self.grouped else None
        out = formulas.distribution_summary(used, self.geometry.bins, drift, names, self.worst_groups)
        offsets = np.cumsum([0, *self._watch.bins])
        mass = np.asarray(self.ema, dtype=np.float64).ravel()
        out |= self._watch.measured(float(drift.mean()), self.state.fleet_version > 0)
        return out | self._watch.metrics([float(mass[a:b].sum()) for a, b in itertools.pairwise(offsets)])

    def _grouped(self, ema: NDArray[Any]) -> NDArray[Any]:
        """The start-bin distributions ``[G, width]`` an EMA gives, in the sampler's dtype."""
        probs: NDArray[Any] = formulas.grouped_probabilities(
            formulas.NUMPY.cast(ema, self.ema),
            self.geometry,
            self.uniform_ratio,
            self.kernel,
            formulas.NUMPY,
            self.uniform_mix,
        )
        return probs

    def _distributions(self, ema: NDArray[Any]) -> NDArray[np.float64]:
        """`_grouped` in float64 (for distances)."""
        return self._grouped(ema).astype(np.float64)

    def sampling_ema(self) -> NDArray[Any]:
        """The EMA the start distribution is built from (`FailureEma.sampling_ema`)."""
        return self.state.sampling_ema()

    def write_sampling_ema(self, out: NDArray[Any]) -> None:
        """Write the EMA that decides the start distribution into ``out`` in place."""
        self.state.write_sampling_ema(out)

    def probabilities(self) -> NDArray[Any]:
        """The start-bin distributions, ``[G, width]`` (zero past a group's bins), or ``[bins]``."""
        probs = self._grouped(self.sampling_ema())
        return probs if self.grouped else probs[0]

    def rebuild(self) -> None:
        """Write the CDF of `probabilities` into ``cdf`` in place; each row ends at exactly 1."""
        probs = self.probabilities().reshape(self.groups, self.width).astype(np.float64)
        cdf = np.cumsum(probs, axis=1)
        np.copyto(self.cdf.reshape(self.groups, self.width), cdf / cdf[:, -1:], casting="unsafe")
        self._built_from = self.sampling_ema().copy()
        self.rebuilds += 1

    def sample(self, n: int, group_ids: NDArray[Any] | None = None, *, rng: np.random.Generator) -> NDArray[Any]:
        """Start time steps for ``n`` envs: a bin from the group's CDF, then a uniform offset inside it."""
        if self._built_from is None or formulas.moved_beyond(
            self._built_from, self.sampling_ema(), self.geometry, self.rebuild_tol, self.uniform_ratio, formulas.NUMPY
        ):
            self.rebuild()
        g = self._groups_of(group_ids, n)
        rows = self.cdf.reshape(self.groups, self.width)
        u = rng.random(n)
        bins = np.empty(n, dtype=np.int64)
        for group in np.unique(g):
            at = g == group
            bins[at] = np.searchsorted(rows[group], u[at], side="right")
        bins = np.minimum(bins, self.geometry.bins[g] - 1)
        offset = rng.random(n)
        frames: NDArray[np.int64] = ((bins + offset) / self.geometry.bins[g] * (self.frame_counts[g] - 1)).astype(
            np.int64
        )
        return frames

    def group_probabilities(self) -> NDArray[Any]:
        """The distribution over groups: failure mass with a uniform floor (the torch term's formula)."""
        mass = formulas.group_sums(np.asarray(self.sampling_ema(), dtype=np.float64), self.geometry, formulas.NUMPY)
        weights: NDArray[Any] = formulas.group_weights(mass, self.group_uniform_ratio, self.groups, formulas.NUMPY)
        return weights

    def _groups_of(self, group_ids: NDArray[Any] | None, n: int) -> NDArray[Any]:
        if group_ids is None:
            if self.groups > 1:
                raise ValueError(f"this sampler has {self.groups} groups; pass group_ids (one per env)")
            return np.zeros(n, dtype=np.int64)
        g = np.asarray(group_ids, dtype=np.int64)
        if g.shape != (n,):
            raise ValueError(f"group_ids must have shape ({n},), one group per env; got {g.shape}")
        if n and (g.min() < 0 or g.max() >= self.groups):
            raise ValueError(f"group_ids must lie in [0, {self.groups}); got values in [{g.min()}, {g.max()}]")
        return g

    # ------------------------------------------------------------------ the seam: the state's

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        return self.state.schema_entries(self.groups)

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`); observing, with
        the drift it measures now (what `metrics` measures, for `redisync watch` and the exporter)."""
        return self.state.report_shard_state(self._measured_drift())

    def _measured_drift(self) -> NDArray[np.float64] | None:
        """Per group, the own distribution's TV from the pooled one now; None unless observing with a
        fleet state in hand."""
        if self.state.role is not Role.OBSERVES or self.state.fleet_version == 0:
            return None
        pooled = self.state.pooled_ema()
        assert pooled is not None
        drift: NDArray[np.float64] = 0.5 * np.abs(self._distributions(self.ema) - self._distributions(pooled)).sum(
            axis=1
        )
        return drift

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        self.state.apply_shard_state(fleet)


def _caller_array(array: NDArray[Any] | None, shape: tuple[int, ...], dtype: np.dtype[Any], name: str) -> NDArray[Any]:
    """The caller's array, checked (it is written in place, never replaced), or a new one."""
    if array is None:
        return np.zeros(shape, dtype=dtype)
    if not isinstance(array, np.ndarray) or array.size != int(np.prod(shape)) or array.dtype != dtype:
        raise InvalidSchema(
            f"{name} must be a numpy array of {int(np.prod(shape))} {dtype} values (written in place); "
            f"got {type(array).__name__} {getattr(array, 'shape', '')} {getattr(array, 'dtype', '')}"
        )
    if not array.flags.writeable or not array.flags.c_contiguous:
        raise InvalidSchema(f"{name} must be a writeable, C-contiguous array: the sampler updates it in place")
    return array
