"""holosoma's whole-body tracking, synced: the adaptive start-frame sampler of its
``MotionCommand`` and the observation normalisers of its FastSAC agent.

holosoma's ``AdaptiveTimestepsSampler`` (``holosoma.managers.command.terms.wbt``; on in the G1
WBT preset) keeps its failure EMA ``bin_failed_count`` per process and never syncs it: holosoma's
FastSAC calls ``synchronize_curriculum_state`` only with a penalty or domain-randomisation
curriculum, so under torchrun every rank samples from its own EMA. `sync_motion_command`
swaps the sampler of every ``MotionCommand`` for a `SyncedAdaptiveTimestepsSampler`
carrying its state: holosoma's own code still records the failures (``+=``), folds the EMA,
builds the probabilities and draws, and while it draws ``bin_failed_count`` is the EMA the mode
samples from (the fleet's sum for ``pooled``, the owner's for ``broadcast``; ``local`` is
holosoma's algorithm, the same draws from the same seed)::

    env = ...                                     # holosoma's WholeBodyTrackingManager
    sync_motion_command(env)                      # REDISYNC_URL, REDISYNC_SHARD / RANK
    agent = ...                                   # holosoma's FastSAC agent
    sync_fastsac_normalizers(agent)               # its two normalisers, without their all-reduce
    agent.learn()

holosoma's FastSAC normaliser (``fast_sac_utils.EmpiricalNormalization``) all-reduces its shifted
sums at every update when a process group exists; `sync_fastsac_normalizers` replaces it
with redisync's pooled normaliser (rsl_rl's buffers, which holosoma's class shares, so its
checkpoints load both ways), called the way holosoma calls its own (``center``, ``update``).
``pooled`` holds the exact mean and variance of every sample the fleet saw; holosoma's own running
update takes the variance's mean correction after moving the mean, so its variance differs from
the exact one by a little per update — ``local`` mode is holosoma's update, as it is.
"""

from __future__ import annotations

from typing import Any

import torch
from holosoma.agents.fast_sac.fast_sac_utils import EmpiricalNormalization as FastSacNormalization
from holosoma.managers.command.terms.wbt import AdaptiveTimestepsSampler

from ..errors import ConfigurationError
from ..terms.role import role_of
from ..terms.sampler_options import DropInMode
from ..terms.torch.normalization import Mode as NormMode
from ..terms.torch.sampler import AdaptiveMotionSampler
from . import ProcessFleet, fleet_shards_from_env, process_fleet
from .holosoma import log_value
from .normalizers import FleetNormalization
from .sampler_attribute import SamplerAttribute

KEY_PREFIX = "holosoma"


class SyncedAdaptiveTimestepsSampler(AdaptiveTimestepsSampler):
    """holosoma's sampler whose failure EMA lives in a synced `AdaptiveMotionSampler`
    (``state``): holosoma's code reads and rebinds ``bin_failed_count`` and
    ``current_bin_failed_count``, which are the synced sampler's buffers, updated in place. The
    fleet meets it once per env step (``update_bin_failed_count``: a hand-over, no network) and at
    each draw (a swap of the prefetched fleet state)."""

    def __init__(
        self,
        motion_time_step_total: int,
        device: str,
        env_fps: int,
        *,
        mode: DropInMode = "pooled",
        key: str = f"{KEY_PREFIX}/motion.bin_failed",
        owner: int = 0,
        stale_after_s: float | None = None,
        fleet: ProcessFleet | None = None,
        **adaptive: Any,
    ):
        self._drawing = False
        super().__init__(motion_time_step_total, device, env_fps, **adaptive)
        self.mode, self.fleet = mode, fleet if fleet is not None else process_fleet()
        # holosoma's bins: T // fps + 1, which is the synced sampler's for step_dt = 1 / fps
        self.state = AdaptiveMotionSampler(
            motion_time_step_total,
            1.0 / max(env_fps, 1),
            mode=mode,
            key=key,
            shard_id=self.fleet.shard_id,
            owner=owner,
            alpha=self.adaptive_alpha,
            uniform_ratio=self.adaptive_uniform_ratio,
            kernel_size=self.adaptive_kernel_size,
            kernel_lambda=self.adaptive_lambda,
            stale_after_s=stale_after_s,
            fleet_shards=fleet_shards_from_env(),
            device=device,
        )
        if self.state.bin_count != self.num_bins:
            raise ConfigurationError(f"holosoma's sampler has {self.num_bins} bins, redisync's {self.state.bin_count}")
        self.state.set_own_ema(self.__dict__.pop("_initial_bin_failed_count"))
        self.state._current_bin_failed.copy_(self.__dict__.pop("_initial_current_bin_failed_count"))
        if self.state.role.syncs:
            self.fleet.add(self.state)

    @classmethod
    def replacing(cls, sampler: AdaptiveTimestepsSampler, **sync: Any) -> SyncedAdaptiveTimestepsSampler:
        """A synced sampler with ``sampler``'s settings and failure counts."""
        synced = cls(
            sampler.motion_time_step_total,
            sampler.device,
            sampler.env_fps,
            adaptive_kernel_size=sampler.adaptive_kernel_size,
            adaptive_lambda=sampler.adaptive_lambda,
            adaptive_uniform_ratio=sampler.adaptive_uniform_ratio,
            adaptive_alpha=sampler.adaptive_alpha,
            **sync,
        )
        synced.bin_failed_count = sampler.bin_failed_count
        synced.current_bin_failed_count.copy_(sampler.current_bin_failed_count)
        return synced

    # holosoma's code reads and rebinds these two; they live in the synced sampler (``state``)
    bin_failed_count = SamplerAttribute("state", "ema")
    current_bin_failed_count = SamplerAttribute("state", "current")

    # the env's ``log_dict`` (holosoma's agents log it as ``Env/...``): the fleet's metrics join it each step
    log_dict: dict[str, Any] | None = None

    def update_bin_failed_count(self) -> None:
        """holosoma's per-step EMA fold; then one env step counts toward the fleet's next report."""
        super().update_bin_failed_count()
        if self.state.role.syncs:
            self.fleet.on_step()
            if self.log_dict is not None:
                self.fleet.put_metrics(self.log_dict, log_value)

    def sample(self, num_samples: int) -> torch.Tensor:
        """holosoma's draw of start frames, from the fleet's EMA (swapped in first) in a synced mode."""
        if self.state.role.syncs:
            self.fleet.at_reset_boundary()
        self._drawing = True
        try:
            return super().sample(num_samples)
        finally:
            self._drawing = False


def motion_commands(target: Any) -> list[Any]:
    """The ``MotionCommand`` terms with an adaptive sampler under ``target`` (an env with a
    ``command_manager``, a command manager, or a command)."""
    if hasattr(target, "adaptive_timesteps_sampler"):
        return [target]
    manager = getattr(target, "command_manager", target)
    terms = getattr(manager, "_state_terms", {})
    return [t for t in terms.values() if hasattr(t, "adaptive_timesteps_sampler")]


def sync_motion_command(
    target: Any,
    mode: DropInMode = "pooled",
    *,
    key: str = f"{KEY_PREFIX}/motion.bin_failed",
    owner: int = 0,
    stale_after_s: float | None = None,
    fleet: ProcessFleet | None = None,
    start: bool = True,
) -> ProcessFleet:
    """Swap the adaptive sampler of every ``MotionCommand`` under ``target`` for a synced one with its
    state, and add it to ``fleet`` (the process's by default), which is returned. ``stale_after_s``:
    a shard that has not published for that long (a dead rank that never comes back) leaves the pool."""
    commands = motion_commands(target)
    if not commands:
        raise ConfigurationError(
            "no holosoma MotionCommand with an adaptive sampler found: "
            "set use_adaptive_timesteps_sampler=True in its MotionConfig"
        )
    if len(commands) > 1 and role_of(mode, leads=False).syncs:
        raise ConfigurationError(
            f"{len(commands)} motion commands would share the key {key!r}: sync one per call with its own key"
        )
    fleet = fleet if fleet is not None else process_fleet()
    for command in commands:
        synced = SyncedAdaptiveTimestepsSampler.replacing(
            command.adaptive_timesteps_sampler,
            mode=mode,
            key=key,
            owner=owner,
            stale_after_s=stale_after_s,
            fleet=fleet,
        )
        synced.log_dict = getattr(target, "log_dict", None)  # an env: its metrics reach holosoma's logger
        command.adaptive_timesteps_sampler = synced
    if start:
        fleet.start()
    return fleet


class SyncedFastSacNormalization(FleetNormalization):
    """redisync's normaliser called as holosoma's FastSAC calls its own: ``forward(x, center, update)``."""

    @torch.no_grad()
    def forward(self, x: torch.Tensor, center: bool = True, update: bool = True) -> torch.Tensor:
        """holosoma FastSAC's normalise (and update, when training) with the synced statistics."""
        if x.shape[1:] != self._mean.shape[1:]:
            raise ValueError(f"Expected input of shape (*,{self._mean.shape[1:]}), got {x.shape}")
        if self.training and update:
            self.update(x)
        if center:
            return (x - self._mean) / (self._std + self.eps)
        return x / (self._std + self.eps)

    def _running_update(self, x: torch.Tensor) -> None:
        # local mode is holosoma's own update, run on these buffers (the same names as holosoma's)
        FastSacNormalization.update(self, x)  # type: ignore[arg-type]  # its buffers, by name: holosoma's method runs on them


def sync_fastsac_normalizers(
    agent: Any, *, mode: NormMode = "pooled", fleet: ProcessFleet | None = None, start: bool = True
) -> ProcessFleet:
    """Replace holosoma FastSAC's ``obs_normalizer`` and ``critic_obs_normalizer`` (before ``learn()``,
    which binds their ``forward``) with synced ones carrying their state; keys ``holosoma/<attribute>``."""
    names = [
        n
        for n in ("obs_normalizer", "critic_obs_normalizer")
        if isinstance(getattr(agent, n, None), FastSacNormalization)
    ]
    if not names:
        raise ConfigurationError(
            "no holosoma FastSAC EmpiricalNormalization on the agent (obs_normalizer, "
            "critic_obs_normalizer): build it with obs_normalization=True"
        )
    fleet = fleet if fleet is not None else process_fleet()
    syncs = role_of(mode, leads=False).syncs
    synced = []
    for name in names:
        module = getattr(agent, name)
        # local: holosoma's update, without the collective and without the fleet
        replacement = SyncedFastSacNormalization.replacing(
            module, key=f"{KEY_PREFIX}/{name}", fleet=fleet if syncs else None, mode=mode
        )
        setattr(agent, name, replacement)
        synced.append(replacement)
    if syncs:
        fleet.add(*synced)
        if start:
            fleet.start()
    return fleet
