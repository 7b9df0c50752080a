"""holosoma's curriculum sync, through the store: no broadcast, no barrier, in every topology.

holosoma 0.0.3's FastSAC, PPO and distillation agents call ``env.synchronize_curriculum_state()``
only when multi-GPU (``if self.is_multi_gpu``) and only with a penalty or domain-randomisation
curriculum; the locomotion manager then ``dist.broadcast``s rank 0's average episode length and
penalty scale — two collectives that wait for every rank. A fleet of single-process collectors
never reaches it. `sync_curriculum` therefore syncs where the curriculum decides: on the env's
``curriculum_manager`` (its ``reset(env_ids)``, where the tracker takes the finished episodes and
the penalty curriculum rescales, and its ``step()``, once per env step), and also replaces
``synchronize_curriculum_state`` (so a multi-GPU run's call goes through the store, not a
collective). The same state moves through the store:

- ``episode_length="broadcast"`` (default): rank 0's (the owner's) tracker average is set on every
  other shard's tracker at each sync, as holosoma's broadcast does;
  ``episode_length="pooled"``: every shard's tracker keeps its own average, and the curriculum
  decides on the fleet's mean of the trackers, each weighted by the episodes behind it (up to
  its window) — every shard decides from the same number, and no shard's episodes are dropped;
- ``penalty_scale="broadcast"`` (default): the owner's scale is everybody's. Unlike holosoma's
  broadcast, which sets only ``env.reward_penalty_scale`` (the logged copy, overwritten from the
  term's own scale at the next reset), this sets the ``PenaltyCurriculum`` term's scale, so the
  rewards use the owner's scale too. ``"local"`` leaves each shard's scale its own.

    env = ...                                        # holosoma's locomotion env
    sync_curriculum(env)                             # REDISYNC_URL, REDISYNC_SHARD / RANK
    agent.learn()                                    # every reset decides on the fleet's state

At each curriculum reset: the newest fleet state is swapped in and applied (the owner's tracker
average before the tracker and the penalty decide; the owner's penalty scale again after the
penalty term has decided, so the rewards use it); at each curriculum step the fleet counts a step
(a report every ``publish_every_steps``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from holosoma.managers.curriculum.terms.locomotion import AverageEpisodeLengthTracker, PenaltyCurriculum

from ..errors import ConfigurationError
from ..store.codec import PullResult
from ..store.schema import KeySpec, broadcast, merge
from ..terms import formulas
from ..terms.role import Role, role_of
from . import ProcessFleet, process_fleet


class TrackerSync:
    """A synced term over holosoma's ``AverageEpisodeLengthTracker`` (key ``holosoma/episode_length``)."""

    def __init__(
        self, tracker: AverageEpisodeLengthTracker, mode: Literal["broadcast", "pooled"], shard_id: int, owner: int
    ):
        if mode not in ("broadcast", "pooled"):
            raise ConfigurationError(f"episode_length must be 'broadcast' or 'pooled', got {mode!r}")
        self.tracker, self.mode, self.shard_id, self.owner = tracker, mode, shard_id, owner
        self.role = role_of(mode, leads=shard_id == owner)
        self.key = "holosoma/episode_length"
        self.episodes = 0  # pooled: the episodes behind this shard's own average
        self._fleet: tuple[float, float] | float | None = None  # the rest of the fleet (pooled) or the owner's average
        if self.role is Role.POOLS:
            self._count_episodes()

    def _count_episodes(self) -> None:
        # the tracker's own update and state stay holosoma's; the curriculum reads the pooled mean
        tracker, update = self.tracker, self.tracker.update

        def counted_update(env_ids: torch.Tensor, episode_lengths: torch.Tensor) -> None:
            if not tracker._suppress_next_update:
                self.episodes += env_ids.numel()
            update(env_ids, episode_lengths)

        tracker.update = counted_update  # type: ignore[method-assign]  # the drop-in wraps holosoma's method
        tracker.get_average = self.pooled_average  # type: ignore[method-assign]  # likewise

    def _own(self) -> tuple[float, float]:
        weight = float(min(self.episodes, self.tracker.num_compute_average_epl))
        return weight, weight * float(self.tracker.average_episode_length)

    def pooled_average(self) -> torch.Tensor:
        """The fleet's mean episode length, each tracker weighted by the episodes behind it."""
        others = self._fleet if isinstance(self._fleet, tuple) else (0.0, 0.0)
        weight, _ = self._own()
        value = formulas.pooled_average(weight, float(self.tracker.average_episode_length), others)
        return torch.as_tensor(value, device=self.tracker.average_episode_length.device, dtype=torch.float)

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        if self.role.broadcasts:
            return {self.key: broadcast((), owner=self.owner)}
        return {self.key: merge((), lifecycle="state")}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        if self.role is Role.POOLS:
            count, total = self._own()
            return {self.key: {"count": count, "sum": total}}
        if self.role is Role.LEADS:
            return {self.key: {"value": float(self.tracker.get_average())}}
        return {}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if view is None or view.value is None:
            return
        if self.role.broadcasts:
            self._fleet = float(view.parts()["value"])
        else:
            others = view.others_parts()
            self._fleet = (float(others["count"]), float(others["sum"]))

    def enforce(self) -> None:
        """At each sync, as holosoma's broadcast: a non-owner's tracker takes the owner's average."""
        if self.role is Role.FOLLOWS and isinstance(self._fleet, float):
            self.tracker.set_average(self._fleet, suppress_update=False)


class PenaltyScaleSync:
    """The owner's penalty scale, everybody's (key ``holosoma/penalty_scale``): the scale of the
    env's ``PenaltyCurriculum`` term, or ``env.reward_penalty_scale`` where there is none."""

    def __init__(self, env: Any, term: PenaltyCurriculum | None, shard_id: int, owner: int):
        self.env, self.term, self.shard_id, self.owner = env, term, shard_id, owner
        self.key = "holosoma/penalty_scale"
        self._owners: float | None = None

    @property
    def scale(self) -> float:
        """The penalty scale this shard's curriculum holds."""
        return float(self.term.current_scale if self.term is not None else self.env.reward_penalty_scale)

    def schema_entries(self) -> Mapping[str, KeySpec]:
        """The keys this term syncs and their specs (the seam: `SyncedTerm`)."""
        return {self.key: broadcast((), owner=self.owner)}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        """This shard's report of its own cumulative state (the seam: `SyncedTerm`)."""
        return {self.key: {"value": self.scale}} if self.shard_id == self.owner else {}

    def apply_shard_state(self, fleet: PullResult) -> None:
        """Take in the fleet state as last pulled; local work only (the seam: `SyncedTerm`)."""
        view = fleet.keys.get(self.key)
        if view is not None and view.value is not None:
            self._owners = float(view.parts()["value"])

    def enforce(self) -> None:
        """Set the owner's penalty scale on this shard (the env's and the term's own)."""
        if self.shard_id == self.owner or self._owners is None:
            return
        if self.term is not None:
            self.term.current_scale = self._owners  # the scale the rewards use (re-applied at the term's next step)
        self.env.reward_penalty_scale = self._owners


def log_value(value: float) -> torch.Tensor:
    """A metric as holosoma's ``log_dict`` holds its own: a float tensor."""
    return torch.tensor(value, dtype=torch.float)


class CurriculumSync:
    """``env.synchronize_curriculum_state`` through the store: hands this shard's curriculum state
    to the fleet's worker, takes in the last fleet state it pulled, and applies the owner's
    decisions — no collective; ``device`` and ``world_size`` are accepted and not needed."""

    def __init__(
        self,
        env: Any,
        *,
        episode_length: Literal["broadcast", "pooled"] = "broadcast",
        penalty_scale: Literal["broadcast", "local"] = "broadcast",
        owner: int = 0,
        fleet: ProcessFleet | None = None,
    ):
        if penalty_scale not in ("broadcast", "local"):
            raise ConfigurationError(f"penalty_scale must be 'broadcast' or 'local', got {penalty_scale!r}")
        self.fleet = fleet if fleet is not None else process_fleet()
        shard = self.fleet.shard_id
        terms = dict(env.curriculum_manager.iter_terms())
        trackers = [t for t in terms.values() if isinstance(t, AverageEpisodeLengthTracker)]
        if len(trackers) != 1:
            raise ConfigurationError(
                f"the env's curriculum has {len(trackers)} AverageEpisodeLengthTracker terms; one is needed"
            )
        self.terms: list[TrackerSync | PenaltyScaleSync] = [TrackerSync(trackers[0], episode_length, shard, owner)]
        penalty = next((t for t in terms.values() if isinstance(t, PenaltyCurriculum)), None)
        if penalty_scale == "broadcast" and (penalty is not None or hasattr(env, "reward_penalty_scale")):
            self.terms.append(PenaltyScaleSync(env, penalty, shard, owner))
        self.fleet.add(*self.terms)
        self._hook(env.curriculum_manager, getattr(env, "log_dict", None))

    def _hook(self, manager: Any, log_dict: dict[str, Any] | None) -> None:
        """Sync where the curriculum decides: its manager's reset and step, on this instance; each
        step the fleet's metrics join the env's ``log_dict``, which holosoma's agents log as ``Env/...``."""
        reset, step = manager.reset, manager.step

        def synced_reset(env_ids: Any) -> None:
            if env_ids is not None and (not torch.is_tensor(env_ids) or env_ids.numel() > 0):
                self.fleet.at_reset_boundary()
                self.enforce()  # the tracker decides (and the penalty reads it) on the owner's or the fleet's
            reset(env_ids)
            self.enforce()  # the owner's penalty scale over the one this shard's term just chose

        def synced_step() -> None:
            step()
            self.fleet.on_step()
            if log_dict is not None:
                self.fleet.put_metrics(log_dict, log_value)

        manager.reset, manager.step = synced_reset, synced_step

    def enforce(self) -> None:
        """Each term applies the owner's (or the fleet's) decision over this shard's own."""
        for term in self.terms:
            term.enforce()

    def __call__(self, *, device: Any = None, world_size: int | None = None) -> None:
        self.fleet.flush()  # a multi-GPU agent's call once per rollout: every call reports
        self.fleet.at_reset_boundary()
        self.enforce()


def sync_curriculum(env: Any, *, start: bool = True, **options: Any) -> CurriculumSync:
    """Sync ``env``'s curriculum where it decides (its curriculum manager's reset and step) and
    replace ``env.synchronize_curriculum_state`` with a `CurriculumSync` (options as there);
    start the fleet (``start=False``: at the first env step, for terms still to be added)."""
    sync = CurriculumSync(env, **options)
    env.synchronize_curriculum_state = sync
    if start:
        sync.fleet.start()
    return sync
