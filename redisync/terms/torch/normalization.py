"""Empirical observation normalisation (rsl_rl's ``EmpiricalNormalization``), synced.

The buffers and their ``state_dict`` keys are rsl_rl's — ``_mean``, ``_var``, ``_std`` (shape
``(1, *shape)``) and ``count`` — so a state dict loads into and from rsl_rl's module, and
``forward``/``update``/``inverse`` behave like rsl_rl's. What the buffers hold depends on the mode:

- ``local``: rsl_rl's own running update, nothing synced;
- ``pooled`` (default): the own-substituted fleet statistics. Each shard keeps the cumulative
  ``count``, ``Σ(x − c)`` and ``Σ(x − c)²`` of what *it* saw (float64, shifted by a fixed per-key
  ``offset`` c when cancellation matters) and reports them to a ``merge`` key; the buffers are
  the moments of everybody else's statistics as last pulled plus its own up to now;
- ``learner``: the learner's normaliser is the single writer (``writer=True``, rsl_rl's update)
  and publishes ``mean ‖ var ‖ count`` to a ``broadcast`` key; collectors apply it and never update;
- ``observe``: rsl_rl's own running update, as ``local``, while the shard's own statistics are
  reported and the fleet's read as ``pooled`` does: `metrics` measures how far its mean is off the
  fleet's (``drift_offset_sd``), applying nothing.

Only rsl_rl's four buffers are persistent, so a checkpoint does not hold the shard's own
cumulative statistics: a restarted collector, resumed or not, starts them from zero, and the store
keeps its previous life's slot as retired history (the key's ``history`` lifecycle) — nothing is
counted twice and nothing is lost. ``resumed`` therefore stays False. What a ``pooled`` normaliser
loads from a checkpoint is its *prior*: the buffers it normalises with are the prior plus its own
new samples (rsl_rl's resumed update) for as long as the store holds fewer samples than the prior
— a run resumed on an empty store (a new run, a store restarted) keeps the statistics its policy
was trained with — and the fleet's once the store holds as many, which it does at once when the
run's history is still there. The prior is never reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn

from ...collector.shared_state import NOT_SHARED, SharedState
from ...errors import InvalidSchema
from ...store.codec import PullResult
from ...store.schema import KeySpec, broadcast, merge
from .. import formulas
from ..role import Role, role_of
from .device import DeviceFleet, DeviceReports, copy_counts, on_device
from .ops import TORCH

Mode = Literal["local", "pooled", "learner", "observe"]
MODES: tuple[str, ...] = get_args(Mode)


class SyncedEmpiricalNormalization(nn.Module):
    """rsl_rl's ``EmpiricalNormalization`` (same buffers, ``state_dict`` keys and calls), synced.

    Args:
        shape: the observation's shape.
        eps: added to the standard deviation before dividing (rsl_rl's).
        until: stop updating after this many samples (rsl_rl's; ``None``: never).
        mode: ``"local"`` (rsl_rl's own update, nothing synced), ``"pooled"`` (the fleet's exact
            moments), ``"learner"`` (the writer's statistics, applied by every collector) or
            ``"observe"`` (rsl_rl's own update, the fleet's measured against it: `metrics`).
        key: the store key of its statistics.
        writer: in ``"learner"`` mode, whether this one writes (the learner's).
        owner: in ``"learner"`` mode, the shard id the writer publishes as.
        offset: a fixed per-element shift ``c`` of the summed values (``Σ(x − c)``), where
            cancellation in ``Σx²`` would matter (observations far from zero).
    """

    # buffers (they move with the module; _mean, _var, _std and count are its checkpoint, as rsl_rl's)
    _mean: torch.Tensor
    _var: torch.Tensor
    _std: torch.Tensor
    count: torch.Tensor
    _offset: torch.Tensor
    _own: torch.Tensor  # count, Σ, Σ²
    _others: torch.Tensor
    _prior: torch.Tensor

    def __init__(
        self,
        shape: int | tuple[int, ...] | list[int],
        eps: float = 1e-2,
        until: int | None = None,
        *,
        mode: Mode = "pooled",
        key: str = "obs/norm",
        writer: bool = False,
        owner: int = 0,
        offset: float | NDArray[Any] | torch.Tensor = 0.0,
    ):
        super().__init__()
        if mode not in MODES:
            raise InvalidSchema(f"normaliser mode must be one of {MODES}, got {mode!r}")
        self.eps, self.until = eps, until
        self.mode, self.key, self.writer, self.owner = mode, key, writer, owner
        self.role = role_of(mode, leads=writer)
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.register_buffer("_mean", torch.zeros(self.shape).unsqueeze(0))
        self.register_buffer("_var", torch.ones(self.shape).unsqueeze(0))
        self.register_buffer("_std", torch.ones(self.shape).unsqueeze(0))
        self.register_buffer("count", torch.tensor(0, dtype=torch.long))
        f64 = torch.float64
        self.register_buffer(
            "_offset", torch.broadcast_to(torch.as_tensor(offset, dtype=f64), self.shape).clone(), persistent=False
        )
        self.register_buffer("_own", torch.zeros((3, *self.shape), dtype=f64), persistent=False)  # count, Σ, Σ²
        self.register_buffer("_others", torch.zeros((3, *self.shape), dtype=f64), persistent=False)
        self.register_buffer(
            "_prior", torch.zeros((3, *self.shape), dtype=f64), persistent=False
        )  # a loaded checkpoint's
        self.resumed = False
        self._shared: Any = NOT_SHARED  # brackets the writes to the own statistics once they live in shared memory
        self._received: dict[str, Any] = {}  # the fleet's parts once they are received in shared memory
        # on a CUDA device: the counts behind the pooled moments tallied on the host, and the copies each
        # way through pinned memory (redisync.terms.torch.device)
        self._counts = {"own": 0.0, "others": 0.0, "prior": 0.0}
        self._device_reports: DeviceReports | None = None
        self._device_fleet: DeviceFleet | None = None
        self._fleet_arrived = False  # (observing: a fleet state to measure against)
        self.register_load_state_dict_post_hook(_take_prior)  # type: ignore[no-untyped-call]  # torch leaves it unannotated

    @property
    def mean(self) -> torch.Tensor:
        """The mean it normalises with (rsl_rl's ``_mean``)."""
        return self._mean.squeeze(0).clone()

    @property
    def std(self) -> torch.Tensor:
        """The standard deviation it normalises with (rsl_rl's ``_std``)."""
        return self._std.squeeze(0).clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (rsl_rl's call)."""
        return (x - self._mean) / (self._std + self.eps)

    @torch.jit.unused
    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """Undo the normalisation (rsl_rl's call)."""
        return y * (self._std + self.eps) + self._mean

    @torch.jit.unused
    def update(self, x: torch.Tensor) -> None:
        """Learn from a batch (rows are samples), as rsl_rl does in ``local`` mode."""

        if not self.training or self.role is Role.FOLLOWS:
            return
        device = on_device(self._own) and self.role is Role.POOLS
        if self.until is not None and (self._n() if device else self.count) >= self.until:
            return
        if self.role is not Role.POOLS:
            self._running_update(x)
            if self.role is not Role.OBSERVES:
                return
        shifted = x.detach().to(torch.float64) - self._offset.to(x.device)
        total, squares = shifted.sum(0).to(self._own.device), (shifted * shifted).sum(0).to(self._own.device)
        self._shared.begin()
        try:
            self._own[0] += x.shape[0]
            self._own[1] += total
            self._own[2] += squares
        finally:
            self._shared.end()
        if self.role is Role.OBSERVES:  # (its own statistics are reported, never applied)
            return
        if device:
            self._counts["own"] += x.shape[0]
            self._set_from_pooled_on_device()
            return
        self._set_from_pooled()

    def _running_update(self, x: torch.Tensor) -> None:
        # rsl_rl's update, step for step (a tensor count: int / tensor rounds differently)
        count_x = torch.tensor(x.shape[0], dtype=self.count.dtype, device=self.count.device)
        self.count += count_x
        rate = count_x / self.count
        var_x = torch.var(x, dim=0, unbiased=False, keepdim=True)
        mean_x = torch.mean(x, dim=0, keepdim=True)
        delta_mean = mean_x - self._mean
        self._mean += rate * delta_mean
        self._var += rate * (var_x - self._var + delta_mean * (mean_x - self._mean))
        self._std = torch.sqrt(self._var)

    def _set_from_pooled(self) -> None:
        pooled = self._others + self._own
        if float(self._prior[0].flatten()[0]) > float(pooled[0].flatten()[0]):
            pooled = self._prior + self._own
        n, s, q = pooled
        if float(n.flatten()[0]) <= 0:
            return
        mean_shifted, var = formulas.moments(n, s, q, TORCH)
        self._set(mean_shifted + self._offset, var, round(float(n.flatten()[0])))

    def _prior_rules(self) -> bool:
        """On a device: whether a loaded checkpoint's count exceeds what the fleet and this shard hold
        (then its moments stand in for the fleet's, as in `_set_from_pooled`), from the host's tally."""
        c = self._counts
        return c["prior"] > c["others"] + c["own"]

    def _n(self) -> float:
        """On a device: the pooled count, from the host's tally of what makes it (never the device's)."""
        c = self._counts
        return (c["prior"] if self._prior_rules() else c["others"]) + c["own"]

    def _set_from_pooled_on_device(self) -> None:
        """`_set_from_pooled` on a CUDA device: the branches on counts taken on the host's tally
        (the own batches' sizes, the fleet's count as pulled, a loaded checkpoint's), the moments by
        device kernels: nothing waits for the device."""
        n = self._n()
        if n <= 0:
            return
        base = self._prior if self._prior_rules() else self._others
        count, total, squares = base + self._own
        mean_shifted, var = formulas.moments(count, total, squares, TORCH)
        self._set(mean_shifted + self._offset, var, round(n))

    def _set(self, mean: Any, var: Any, count: int) -> None:
        # fleet moments are finite in float64 (the store refuses others); beyond this dtype's range
        # they are held at its largest value rather than turned into inf
        dtype, device = self._mean.dtype, self._mean.device
        big = torch.finfo(dtype).max
        for buf, value in ((self._mean, mean), (self._var, var)):
            wide = torch.as_tensor(value, dtype=torch.float64).clamp(-big, big)
            buf.copy_(wide.to(device, dtype).reshape(buf.shape))
        self._std.copy_(torch.sqrt(self._var))
        self.count.fill_(count)

    def _load_prior(self) -> None:
        """The loaded buffers as cumulative moments around the offset (float64), kept as the prior."""
        n = float(self.count)  # (loading a checkpoint: not the hot path)
        self._counts["prior"] = n
        mean = self._mean.squeeze(0).to(torch.float64) - self._offset
        var = self._var.squeeze(0).to(torch.float64)
        self._prior.copy_(torch.stack([torch.full_like(mean, n), n * mean, n * (var + mean * mean)]))

    def metrics(self) -> dict[str, float]:
        """Where it pools or observes, once a fleet state arrived: ``drift_offset_sd``, the largest
        offset of the shard's own mean from the fleet's (its own statistics and the others' as last
        pulled), in the fleet's standard deviations; an observing shard normalises with its own
        statistics, so this is how far its inputs are off the fleet's (as the numpy normaliser's)."""
        own = self._own.detach().to("cpu")  # (a logger's call, not the hot path: on a device it waits)
        if not self.role.pools or not self._fleet_arrived or float(own[0].flatten()[0]) <= 0:
            return {}
        pooled = self._others.detach().to("cpu") + own
        own_mean, _ = formulas.moments(own[0], own[1], own[2], TORCH)
        fleet_mean, fleet_var = formulas.moments(pooled[0], pooled[1], pooled[2], TORCH)
        offset = (own_mean - fleet_mean).abs() / fleet_var.sqrt().clamp_min(1e-12)
        return {"drift_offset_sd": float(offset.max())}

    def pooled_moments(self) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``pooled``: the float64 mean, var and count of the own-substituted view (for tests and logs)."""
        n, s, q = self._others + self._own
        mean, var = formulas.moments(n, s, q, TORCH)
        return mean + self._offset, var, float(n.flatten()[0])

    # ------------------------------------------------------------------ the seam

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        size = int(np.prod(self.shape))
        if self.role.pools:
            return {self.key: merge(self.shape, sumsq=True, lifecycle="history")}
        if self.role.broadcasts:
            return {self.key: broadcast(2 * size + 1, owner=self.owner)}
        return {}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if on_device(self._own) and self.role.syncs:
            return self._device_report(settle=False)
        if self.role.pools:
            own = self._own.cpu().numpy()
            return {self.key: {"count": float(own[0].flatten()[0]), "sum": own[1].copy(), "sumsq": own[2].copy()}}
        if self.role is Role.LEADS:
            flat = [t.detach().to("cpu", torch.float64).flatten() for t in (self._mean, self._var)]
            value = torch.cat([*flat, torch.tensor([float(self.count)], dtype=torch.float64)])
            return {self.key: {"value": value.numpy()}}
        return {}

    def device_copies(self) -> dict[str, int]:
        """What the device copies of this term left undone (`copy_counts`)."""
        return copy_counts(self._device_reports, self._device_fleet)

    def settle(self) -> Mapping[str, Mapping[str, Any]]:
        """The current report, waiting for the device where the term lives on one: what a flush or a
        stop hands over (the syncers call it there, never on the hot path)."""
        if on_device(self._own) and self.role.syncs:
            return self._device_report(settle=True)
        return self.report_shard_state()

    def _device_report(self, settle: bool) -> Mapping[str, Mapping[str, Any]]:
        """On a CUDA device: the own count, Σ and Σ² (pooled) or the learner's mean, var and count,
        copied to the host without waiting (the newest copy that has landed, or nothing before the
        first has: `DeviceReports`)."""
        if not self.role.reports:
            return {}
        if self.role.pools:
            source = self._own
        else:
            parts = [t.detach().to(torch.float64).flatten() for t in (self._mean, self._var)]
            source = torch.cat([*parts, self.count.to(torch.float64).view(1)])
        reports = self._copies_out()
        got = reports.settle(source) if settle else reports.report(source)
        if got is None:
            return {}
        if self.role is Role.LEADS:
            return {self.key: {"value": got}}
        own = got.reshape(3, -1)
        return {self.key: {"count": float(own[0, 0]), "sum": own[1].copy(), "sumsq": own[2].copy()}}

    def __getstate__(self) -> dict[str, Any]:
        # a copy (deepcopy, pickle) keeps its own memory: it is not the shared term
        state = dict(super().__getstate__())  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        return state | {"_shared": NOT_SHARED, "_received": {}, "_device_reports": None, "_device_fleet": None}

    def share_report(self, shared: SharedState) -> bool:
        """The process worker's fast path: the own count, Σ and Σ² move to shared memory, where the
        sidecar reads them when a publish is due (pooled, on the CPU; nothing to share when the term
        reports nothing)."""
        if not self.role.reports:
            return True  # nothing to report
        if not self.role.pools or self._own.device.type != "cpu":
            return False  # the learner's broadcast is a concatenation of its buffers: copied
        self._own = torch.from_numpy(shared.array(self._own.numpy()))
        own = self._own.numpy().reshape(3, -1)
        shared.report(self.key, count=own[0, :1], sum=own[1], sumsq=own[2])
        self._shared = shared
        return True

    def share_fleet(self, shared: SharedState) -> bool:
        """The process worker's fast path: the fleet's parts (the others' count, Σ and Σ², or the
        learner's broadcast) are arrays the reset boundary updates in place, and the buffers are
        recomputed from them right then (``forward`` may be scripted: it cannot look for news)."""
        if self._others.device.type != "cpu":
            return False
        if self.role.pools:
            self._received = {part: shared.receive(self.key, part) for part in ("count", "sum", "sumsq")}
            shared.on_take(self._take_pooled)
        elif self.role is Role.FOLLOWS:
            self._received = {"value": shared.receive(self.key, "value")}
            shared.on_take(self._take_broadcast)
        return True  # local and the learner's own normaliser receive nothing

    def _take_pooled(self) -> None:
        count, total, squares = (self._received[part] for part in ("count", "sum", "sumsq"))
        self._others[0].fill_(float(count))
        self._others[1].copy_(torch.from_numpy(total))
        self._others[2].copy_(torch.from_numpy(squares))
        self._fleet_arrived = True
        if self.role is Role.POOLS:
            self._set_from_pooled()

    def _take_broadcast(self) -> None:
        value = self._received["value"]
        if value[-1] > 0:  # the learner's count: zero until it published
            size = int(np.prod(self.shape))
            self._set(value[:size], value[size : 2 * size], round(float(value[-1])))

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None:
            return
        if self.role.pools:
            others = view.others_parts()
            agg = np.stack([np.broadcast_to(others["count"], self.shape), others["sum"], others["sumsq"]])
            if on_device(self._others):  # from pinned memory, in stream order: nothing waits for the device
                if self._fleet_copies().copy(agg, self._others):
                    self._counts["others"] = float(np.asarray(others["count"]).flat[0])
                    self._fleet_arrived = True
                    if self.role is Role.POOLS:
                        self._set_from_pooled_on_device()
                return
            self._others.copy_(torch.as_tensor(agg, dtype=torch.float64))
            self._fleet_arrived = True
            if self.role is Role.POOLS:
                self._set_from_pooled()
        elif self.role is Role.FOLLOWS:
            size = int(np.prod(self.shape))
            value = view.parts()["value"]
            if on_device(self._others):
                staged = self._others.view(-1)[: 2 * size]  # (a learner's follower keeps no others: its buffer stages)
                if self._fleet_copies().copy(value[: 2 * size], staged):
                    self._set(staged[:size], staged[size:], round(float(value[-1])))
                return
            self._set(value[:size], value[size : 2 * size], round(float(value[-1])))

    def _fleet_copies(self) -> DeviceFleet:
        """The host-to-device copies of the fleet state: the others' count, Σ and Σ² (pooled), or the
        learner's mean and var (its followers)."""
        if self._device_fleet is None:
            size = self._others.numel() if self.role.pools else 2 * int(np.prod(self.shape))
            self._device_fleet = DeviceFleet(size)
        return self._device_fleet

    def _copies_out(self) -> DeviceReports:
        """The device-to-host copies of its reports: the own count, Σ and Σ² (pooled), or the
        learner's mean, var and count."""
        if self._device_reports is None:
            size = self._own.numel() if self.role.pools else 2 * int(np.prod(self.shape)) + 1
            self._device_reports = DeviceReports(size)
        return self._device_reports

    def prepare(self) -> None:
        """On a CUDA device: the pinned buffers of its copies made now (the syncer's start), not at
        the first report or boundary, on the hot path."""
        if not on_device(self._own) or not self.role.syncs:
            return
        if self.role.reports:
            self._copies_out()
        if self.role.reads_fleet:
            self._fleet_copies()


def _take_prior(module: SyncedEmpiricalNormalization, incompatible: Any) -> None:
    if module.role is Role.POOLS:
        module._load_prior()
