"""Curriculum terms: holosoma's episode-length tracker and penalty curriculum, IsaacLab's terrain levels.

Their update rules and defaults are the frameworks'; sync adds one choice per term:

- `AverageEpisodeLength` — ``local`` (holosoma's tracker of this shard's episodes),
  ``pooled``: each shard reports its tracker as ``count = episodes behind it (capped at the
  tracker's window), sum = count × average``, and every shard reads the fleet's weighted mean, so
  all shards take their decisions from the same number; ``broadcast``: the owner's average; or
  ``observe``: it decides from its own average, as ``local``, while it reports and reads as
  ``pooled`` does, so `AverageEpisodeLength.metrics` measures how far its average is off the fleet's;
- `PenaltyCurriculum` — ``local``, or ``broadcast``: the owner shard (or the learner) decides
  the scale and every other shard applies it, so the scale is one number fleet-wide; or
  ``observe``: each shard decides its own, as ``local``, and reports it, so `PenaltyCurriculum.metrics`
  measures how far it is from the fleet's mean scale;
- `TerrainLevels` — IsaacLab's per-env level moves, with the per-level histogram of the
  shard's envs merged (``pooled``) into the fleet histogram for logging and fleet-level decisions;
  or ``observe``: the histogram merged as ``pooled`` does while the shard logs its own mean level,
  as ``local``, so `TerrainLevels.metrics` measures how far its envs' levels are from the fleet's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray

from ...errors import InvalidSchema
from ...store.codec import PullResult
from ...store.schema import KeySpec, broadcast, merge
from .. import formulas
from ..role import Role, role_of
from .device import DeviceReports, copy_counts, on_device


def _check_mode(mode: str, allowed: tuple[str, ...]) -> None:
    if mode not in allowed:
        raise InvalidSchema(f"mode must be one of {allowed}, got {mode!r}")


BASE_NUM_ENVS = 4096  # holosoma's LeggedRobotLocomotionManager.BASE_NUM_ENVS: the tracker's window is scaled from it


class AverageEpisodeLength:
    """holosoma's ``AverageEpisodeLengthTracker``: ``avg ← avg·(1 − w) + mean(lengths)·w``, ``w = min(n / N, 1)``,
    with holosoma's window ``N = num_compute_average_epl × num_envs / base_num_envs`` (``base_num_envs``
    defaults to holosoma's 4 096, so 1 024 envs average over 250 episodes, as holosoma's do).

    Modes: ``local`` (this shard's episodes), ``pooled`` (the fleet's weighted mean, see the module
    docstring), ``broadcast`` (the owner shard's average is everybody's: holosoma's rank-0 sync) or
    ``observe`` (its own, the fleet's measured against it: `metrics`).
    ``state_dict`` uses holosoma's keys, so the tracker state of a holosoma checkpoint loads here.
    """

    def __init__(
        self,
        num_envs: int,
        num_compute_average_epl: float = 1000,
        base_num_envs: int | None = BASE_NUM_ENVS,
        *,
        mode: Literal["local", "pooled", "broadcast", "observe"] = "local",
        key: str = "curriculum/episode_length",
        shard_id: int = 0,
        owner: int = 0,
        stale_after_s: float | None = None,
    ):
        _check_mode(mode, ("local", "pooled", "broadcast", "observe"))
        self.mode, self.key, self.shard_id, self.owner, self.stale_after_s = mode, key, shard_id, owner, stale_after_s
        self.role = role_of(mode, leads=shard_id == owner)
        self.window = max(1, int(num_compute_average_epl * num_envs / (base_num_envs or num_envs)))
        self.own_average = 0.0
        self.episodes = 0
        self._suppress_next_update = False
        self._others: tuple[float, float] = (0.0, 0.0)  # count, sum of the rest of the fleet
        self._owners: float | None = None  # broadcast: the owner's average as last applied
        self._fleet_arrived = False  # (observing: a fleet state to measure against)
        self.resumed = False

    def update(self, episode_lengths: torch.Tensor) -> None:
        """Fold the lengths of the episodes that ended."""
        if self._suppress_next_update:  # holosoma skips the first batch after a restored or set average
            self._suppress_next_update = False
            return
        num = episode_lengths.numel()
        if num == 0:
            return
        weight = min(num / self.window, 1.0)
        current = float(torch.mean(episode_lengths.to(dtype=torch.float), dtype=torch.float))
        self.own_average = self.own_average * (1 - weight) + current * weight
        self.episodes += num

    def suppress_next_update(self) -> None:
        """Skip the next update (holosoma's first reset after a load)."""
        self._suppress_next_update = True

    def _own_weight(self) -> float:
        return float(min(self.episodes, self.window))

    @property
    def value(self) -> float:
        """The average the curriculum decides on: the shard's own, the fleet's (pooled) or the owner's (broadcast)."""
        if self.role is Role.POOLS:
            return formulas.pooled_average(self._own_weight(), self.own_average, self._others)
        if self.role is Role.FOLLOWS and self._owners is not None:
            return self._owners
        return self.own_average

    def metrics(self) -> dict[str, float]:
        """Where it pools or observes, once a fleet state arrived: the fleet's weighted mean
        (``fleet_episode_length``) and how far this shard's own average is off it, in steps
        (``drift_episode_length``): an observing shard decides from its own."""
        if not self.role.pools or not self._fleet_arrived:
            return {}
        fleet = formulas.pooled_average(self._own_weight(), self.own_average, self._others)
        return {"fleet_episode_length": fleet, "drift_episode_length": self.own_average - fleet}

    def state_dict(self) -> dict[str, Any]:
        """holosoma's checkpoint entries of the tracker."""
        return {
            "average_episode_length": torch.tensor(self.own_average),
            "suppress_next_update": self._suppress_next_update,
            "episodes": self.episodes,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Loads this class's state or holosoma's tracker state (which does not count episodes: a
        loaded average then weighs as a full window, as it did in holosoma)."""
        self.own_average = float(state["average_episode_length"])
        self.episodes = int(state.get("episodes", self.window))
        self._suppress_next_update = bool(state.get("suppress_next_update", False))
        self.resumed = True

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        if self.role.broadcasts:
            return {self.key: broadcast((), owner=self.owner)}
        # the tracker is a current average, not a history: a fresh restart drops the previous life's slot
        return {self.key: merge((), stale_after_s=self.stale_after_s, lifecycle="state")} if self.role.pools else {}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if self.role is Role.LEADS:
            return {self.key: {"value": self.own_average}}
        if not self.role.pools:
            return {}
        w = self._own_weight()
        return {self.key: {"count": w, "sum": w * self.own_average}}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if not self.role.syncs or view is None or view.value is None:
            return
        if self.role.broadcasts:
            self._owners = float(view.parts()["value"])
            return
        others = view.others_parts()
        self._others = (float(others["count"]), float(others["sum"]))
        self._fleet_arrived = True


class PenaltyCurriculum:
    """holosoma's ``PenaltyCurriculum``: at each reset the scale shrinks by ``1 − degree`` below
    ``level_down_threshold``, grows by ``1 + degree`` above ``level_up_threshold``, and is clipped.

    The initial scale is clipped at once (holosoma clips it on its first step, before any reward
    uses it). ``state_dict`` holds the scale; ``load_state_dict`` also takes holosoma's checkpoint
    entry ``reward_penalty_scale``, which holosoma itself restores only for logging.
    """

    def __init__(
        self,
        initial_scale: float = 1.0,
        min_scale: float = 0.0,
        max_scale: float = 1.0,
        level_down_threshold: float = 150.0,
        level_up_threshold: float = 850.0,
        degree: float = 0.0,
        *,
        mode: Literal["local", "broadcast", "observe"] = "local",
        key: str = "curriculum/penalty_scale",
        shard_id: int = 0,
        owner: int = 0,
    ):
        _check_mode(mode, ("local", "broadcast", "observe"))
        self.min_scale, self.max_scale = float(min_scale), float(max_scale)
        self.scale = self._clipped(float(initial_scale))
        self.level_down, self.level_up, self.degree = (
            float(level_down_threshold),
            float(level_up_threshold),
            float(degree),
        )
        self.mode, self.key, self.shard_id, self.owner = mode, key, shard_id, owner
        self.role = role_of(mode, leads=shard_id == owner)
        self._others: tuple[float, float] | None = None  # (observing: the others' count and summed scale)

    def _clipped(self, scale: float) -> float:
        return float(np.clip(scale, self.min_scale, self.max_scale))

    @property
    def decides(self) -> bool:
        """Whether this shard takes the decision (always, unless another shard owns it)."""
        return self.role is not Role.FOLLOWS

    def update(self, average_length: float) -> float:
        """At reset: move the scale by the average episode length; returns the scale to apply."""
        if self.decides:
            if average_length < self.level_down:
                self.scale *= 1.0 - self.degree
            elif average_length > self.level_up:
                self.scale *= 1.0 + self.degree
            self.scale = self._clipped(self.scale)
        return self.scale

    def state_dict(self) -> dict[str, Any]:
        """holosoma's checkpoint entry: the current scale."""
        return {"current_scale": self.scale}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load holosoma's checkpoint entry."""
        value = state["current_scale"] if "current_scale" in state else state["reward_penalty_scale"]
        self.scale = self._clipped(float(value))

    def metrics(self) -> dict[str, float]:
        """Observing, once a fleet state arrived: the fleet's mean scale (every shard's, this one's
        as of now) and how far this shard's own is from it (``drift_penalty_scale``)."""
        if self.role is not Role.OBSERVES or self._others is None:
            return {}
        count, total = self._others
        fleet = (total + self.scale) / (count + 1.0)
        return {"fleet_penalty_scale": fleet, "drift_penalty_scale": self.scale - fleet}

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`): observing, each shard's
        scale a slot of a ``merge`` key (a current state: a fresh restart drops the previous life's)."""
        if self.role is Role.OBSERVES:
            return {self.key: merge((), lifecycle="state")}
        return {self.key: broadcast((), owner=self.owner)} if self.role.syncs else {}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if self.role is Role.OBSERVES:
            return {self.key: {"count": 1.0, "sum": self.scale}}
        return {self.key: {"value": self.scale}} if self.role is Role.LEADS else {}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None:
            return
        if self.role is Role.FOLLOWS:
            self.scale = float(view.parts()["value"])
        elif self.role is Role.OBSERVES:
            others = view.others_parts()
            self._others = (float(others["count"]), float(others["sum"]))


class TerrainLevels:
    """IsaacLab's terrain-level curriculum for one shard's envs, with a merged per-level histogram.

    ``update`` moves envs as IsaacLab's ``TerrainImporter.update_env_origins`` does: up one level
    on ``move_up``, down one on ``move_down``, never below 0, and an env that solves the last level
    is sent to a random level. The moves are each env's own in every mode: ``pooled`` merges the
    shards' histograms into the fleet's, ``observe`` merges them too but logs the shard's own
    (`metrics`: the fleet's mean level and the shard's distance from it).
    """

    def __init__(
        self,
        num_envs: int,
        num_levels: int,
        max_init_level: int | None = None,
        *,
        mode: Literal["local", "pooled", "observe"] = "local",
        key: str = "terrain/levels",
        stale_after_s: float | None = 60.0,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ):
        _check_mode(mode, ("local", "pooled", "observe"))
        self.mode, self.key, self.stale_after_s = mode, key, stale_after_s
        self.role = role_of(mode, leads=True)
        self.num_levels = num_levels
        self.generator = generator
        top = num_levels - 1 if max_init_level is None else min(max_init_level, num_levels - 1)
        self.levels = torch.randint(0, top + 1, (num_envs,), device=device, generator=generator)
        self._others: NDArray[Any] = np.zeros(num_levels)
        self._fleet_arrived = False
        self._device_reports: DeviceReports | None = None  # on a CUDA device (redisync.terms.torch.device)

    def update(self, env_ids: torch.Tensor, move_up: torch.Tensor, move_down: torch.Tensor) -> None:
        """IsaacLab's terrain-level moves for the envs that ended an episode."""
        levels = self.levels[env_ids] + 1 * move_up - 1 * move_down
        random = torch.randint(0, self.num_levels, levels.shape, device=levels.device, generator=self.generator)
        self.levels[env_ids] = torch.where(levels >= self.num_levels, random, torch.clip(levels, 0))

    def histogram(self) -> NDArray[Any]:
        """How many of this shard's envs are on each level."""
        return torch.bincount(self.levels, minlength=self.num_levels).cpu().numpy().astype(np.float64)

    def fleet_histogram(self) -> NDArray[Any]:
        """The fleet's histogram: everybody else's as last pulled plus ours as of now."""
        fleet: NDArray[Any] = self._others + self.histogram()
        return fleet

    def mean_level(self) -> float:
        """The fleet's (pooled) or this shard's (local, observe) mean terrain level, IsaacLab's logged metric."""
        hist = self.fleet_histogram() if self.role is Role.POOLS else self.histogram()
        return float((hist * np.arange(self.num_levels)).sum() / max(hist.sum(), 1.0))

    def metrics(self) -> dict[str, float]:
        """Observing, once a fleet state arrived: the fleet's mean level (every shard's envs, this
        one's as of now), this shard's own mean level's distance from it (``drift_mean_level``) and
        the total variation distance between the two level distributions (``drift_levels_tv``)."""
        if self.role is not Role.OBSERVES or not self._fleet_arrived:
            return {}
        own, fleet = self.histogram(), self.fleet_histogram()
        levels = np.arange(self.num_levels)
        own_mean = float((own * levels).sum() / max(own.sum(), 1.0))
        fleet_mean = float((fleet * levels).sum() / max(fleet.sum(), 1.0))
        tv = 0.5 * float(np.abs(own / max(own.sum(), 1.0) - fleet / max(fleet.sum(), 1.0)).sum())
        return {"fleet_mean_level": fleet_mean, "drift_mean_level": own_mean - fleet_mean, "drift_levels_tv": tv}

    def schema_entries(self) -> Mapping[str, KeySpec]:
        # where the shard's envs are now: a state, dropped on a fresh restart
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        merged = merge(self.num_levels, stale_after_s=self.stale_after_s, lifecycle="state")
        return {self.key: merged} if self.role.pools else {}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if not self.role.pools:
            return {}
        if on_device(self.levels):
            return self._device_report(settle=False)
        return {self.key: {"count": float(self.levels.numel()), "sum": self.histogram()}}

    def prepare(self) -> None:
        """On a CUDA device: the pinned buffers of its reports made now (the syncer's start), not at
        the first report, on the hot path."""
        if self.role.pools and on_device(self.levels):
            self._copies_out()

    def _copies_out(self) -> DeviceReports:
        """The device-to-host copies of its histogram."""
        if self._device_reports is None:
            self._device_reports = DeviceReports(self.num_levels)
        return self._device_reports

    def device_copies(self) -> dict[str, int]:
        """What the device copies of this term left undone (`copy_counts`)."""
        return copy_counts(self._device_reports)

    def settle(self) -> Mapping[str, Mapping[str, Any]]:
        """The current report, waiting for the device where the levels live on one: what a flush or a
        stop hands over (the syncers call it there, never on the hot path)."""
        if self.role.pools and on_device(self.levels):
            return self._device_report(settle=True)
        return self.report_shard_state()

    def _device_report(self, settle: bool) -> Mapping[str, Mapping[str, Any]]:
        """On a CUDA device: the histogram copied to the host without waiting (the newest that has
        landed, or nothing before the first has: `DeviceReports`)."""
        # (not bincount: on a device it reads the largest level back to size its output)
        source = torch.zeros(self.num_levels, device=self.levels.device, dtype=torch.float64)
        source.index_add_(0, self.levels, torch.ones_like(self.levels, dtype=torch.float64))
        reports = self._copies_out()
        got = reports.settle(source) if settle else reports.report(source)
        return {} if got is None else {self.key: {"count": float(self.levels.numel()), "sum": got}}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if not self.role.pools or view is None or view.value is None:
            return
        self._others = view.others_parts()["sum"]
        self._fleet_arrived = True
