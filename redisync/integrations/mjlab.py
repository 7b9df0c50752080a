"""mjlab's motion-tracking command with redisync's adaptive sampler: the failure EMA pooled across
the collectors of a fleet.

mjlab's ``MotionCommand`` (BeyondMimic's algorithm) keeps its per-bin failure EMA,
``bin_failed_count``, per process and never syncs it, so N collectors sample start frames from N
different distributions, each with a uniform share N times too large. `SyncedMotionCommand`
is mjlab's class with the EMA held by an `AdaptiveMotionSampler`: mjlab's
own code records the failures, folds the EMA and draws the starts, and at a reset it reads the
sampler's view of the fleet's EMA instead of its own. Switch it on in the task config:

    cfg = load_env_cfg("Mjlab-Tracking-Flat-Unitree-G1")
    cfg.commands["motion"] = synced_motion_command(cfg.commands["motion"])    # mode="pooled"

and start each collector with ``REDISYNC_URL`` (and ``REDISYNC_SHARD`` or torchrun's ``RANK``).

Modes: ``local`` is mjlab's algorithm, bit for bit (the same starts from the same seed);
``pooled`` samples from the fleet's summed EMA — by linearity the EMA one process fed every
failure would hold (up to float32 rounding); ``broadcast`` samples from the owner shard's EMA (holosoma's rank-0 semantics).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from mjlab.tasks.tracking.mdp import MotionCommand, MotionCommandCfg

from ..errors import ConfigurationError
from ..store.schema import Lifecycle
from ..terms.sampler_options import SAMPLER_KEY, DropInMode
from ..terms.torch.sampler import AdaptiveMotionSampler
from . import ProcessFleet, fleet_shards_from_env, process_fleet
from .sampler_attribute import SamplerAttribute


@dataclass(kw_only=True)
class SyncedMotionCommandCfg(MotionCommandCfg):
    """mjlab's ``MotionCommandCfg`` plus how its failure EMA is synced (``sync_mode``, the store key,
    for ``broadcast`` the owner shard, and the merge key's ``stale_after_s`` and ``lifecycle``)."""

    sync_mode: DropInMode = "pooled"
    sync_key: str = SAMPLER_KEY
    sync_owner: int = 0
    sync_stale_after_s: float | None = None  # a shard silent this long (dead, never restarted) leaves the pool
    sync_lifecycle: Lifecycle = "state"  # what a new process of a shard means for its previous life's slot

    def build(self, env: Any) -> SyncedMotionCommand:
        """mjlab builds the command from its config: the synced command."""
        return SyncedMotionCommand(self, env)


def synced_motion_command(
    cfg: MotionCommandCfg, sync_mode: DropInMode = "pooled", **sync: Any
) -> SyncedMotionCommandCfg:
    """A task's motion command config, synced: every field kept, ``sync_mode`` added and ``sync``'s
    keywords (``key``, ``owner``, ``stale_after_s``, ``lifecycle``, with or without the ``sync_``
    prefix)."""
    options = {f.name for f in dataclasses.fields(SyncedMotionCommandCfg)} - {
        f.name for f in dataclasses.fields(MotionCommandCfg)
    }
    sync = {name if name.startswith("sync_") else f"sync_{name}": value for name, value in sync.items()}
    unknown = sorted(set(sync) - options)
    if unknown:
        raise ConfigurationError(
            f"synced_motion_command: unknown option(s) {unknown}; it takes "
            f"{sorted(o.removeprefix('sync_') for o in options - {'sync_mode'})}"
        )
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.init}
    return SyncedMotionCommandCfg(**fields, sync_mode=sync_mode, **sync)


class SyncedMotionCommand(MotionCommand):
    """mjlab's ``MotionCommand`` whose failure EMA lives in a synced `AdaptiveMotionSampler`.

    ``bin_failed_count`` is the sampler's own EMA (what this shard saw: mjlab folds into it, a
    checkpoint keeps it), except while a reset draws start frames, when it is the sampler's
    ``sampling_ema()`` — the fleet's in ``pooled`` mode. The fleet meets the command once per env
    step (a hand-over, no network) and at each reset (a swap of the prefetched fleet state).
    """

    cfg: SyncedMotionCommandCfg

    def __init__(self, cfg: SyncedMotionCommandCfg, env: Any, fleet: ProcessFleet | None = None):
        self._drawing = False
        super().__init__(cfg, env)
        self.fleet = fleet if fleet is not None else process_fleet()
        self.sampler = AdaptiveMotionSampler(
            self.motion.time_step_total,
            env.step_dt,
            mode=cfg.sync_mode,
            key=cfg.sync_key,
            shard_id=self.fleet.shard_id,
            owner=cfg.sync_owner,
            alpha=cfg.adaptive_alpha,
            uniform_ratio=cfg.adaptive_uniform_ratio,
            kernel_size=cfg.adaptive_kernel_size,
            kernel_lambda=cfg.adaptive_lambda,
            stale_after_s=cfg.sync_stale_after_s,
            lifecycle=cfg.sync_lifecycle,
            fleet_shards=fleet_shards_from_env(),
            device=self.device,
        )
        assert self.sampler.bin_count == self.bin_count, (self.sampler.bin_count, self.bin_count)
        del (
            self.__dict__["_initial_bin_failed_count"],
            self.__dict__["_initial_current_bin_failed"],
        )  # mjlab's zeros: the sampler holds the EMA now
        if self.sampler.role.syncs:
            self.fleet.add(self.sampler)

    # mjlab's code reads and rebinds these two; they live in the sampler
    bin_failed_count = SamplerAttribute("sampler", "ema")
    _current_bin_failed = SamplerAttribute("sampler", "current")

    def _adaptive_sampling(self, env_ids: torch.Tensor) -> None:
        if self.sampler.role.syncs:
            self.fleet.at_reset_boundary()
        self._drawing = True
        try:
            super()._adaptive_sampling(env_ids)
        finally:
            self._drawing = False

    def _update_command(self, env_ids: torch.Tensor | None = None) -> None:
        super()._update_command(env_ids)
        if env_ids is None and self.sampler.role.syncs:  # the per-step path: one env step
            self.fleet.on_step()

    def reset(self, env_ids: torch.Tensor | slice | None) -> dict[str, float]:
        """mjlab's reset, whose returned metrics its command manager puts into the env's
        ``extras["log"]`` as ``Metrics/<term>/<name>``: the fleet's metrics join them there, as
        ``Metrics/<term>/redisync/...`` (health, staleness, the drift gauge), read at most once a
        second."""
        if self.sampler.role.syncs:
            for name, value in self.fleet.log_metrics().items():
                held = self.metrics.get(name)
                if held is None:  # mjlab's metrics are per env; the fleet's are one value for all
                    held = self.metrics[name] = torch.zeros(self.num_envs, device=self.device)
                held.fill_(value)
        return super().reset(env_ids)


def keyframe_motion(path: str | Path, seconds: float = 10.0, fps: int = 50, sway: float = 0.3) -> Path:
    """Write a motion file for mjlab's G1 tracking task (the npz its ``MotionLoader`` reads) in which
    the bundled G1 stands in its knees-bent keyframe and sways every joint by ``sway`` rad at 0.5 Hz
    — for trying a set-up before a real motion is at hand. Body and joint order are the model's."""
    import mujoco
    from mjlab.asset_zoo.robots.unitree_g1.g1_constants import KNEES_BENT_KEYFRAME, get_spec

    model = get_spec().compile()
    data = mujoco.MjData(model)
    hinges = [j for j in range(model.njnt) if model.jnt_type[j] != mujoco.mjtJoint.mjJNT_FREE]
    pose = np.zeros(len(hinges))
    for pattern, value in (KNEES_BENT_KEYFRAME.joint_pos or {}).items():
        for i, j in enumerate(hinges):
            if re.fullmatch(pattern, model.joint(j).name):
                pose[i] = value
    t = np.arange(int(seconds * fps)) / fps
    joint_pos = pose + sway * np.sin(np.pi * t)[:, None]
    body_pos, body_quat = [], []
    for q in joint_pos:
        data.qpos[:3], data.qpos[3:7] = KNEES_BENT_KEYFRAME.pos, (1.0, 0.0, 0.0, 0.0)
        data.qpos[model.jnt_qposadr[hinges]] = q
        mujoco.mj_kinematics(model, data)
        body_pos.append(data.xpos[1:].copy())
        body_quat.append(data.xquat[1:].copy())
    pos, quat = np.array(body_pos), np.array(body_quat)
    ang_vel = np.zeros_like(pos)
    for k in range(1, len(t)):
        for b in range(pos.shape[1]):
            mujoco.mju_subQuat(ang_vel[k, b], quat[k, b], quat[k - 1, b])
    arrays = {
        "joint_pos": joint_pos,
        "joint_vel": np.gradient(joint_pos, 1 / fps, axis=0),
        "body_pos_w": pos,
        "body_quat_w": quat,
        "body_lin_vel_w": np.gradient(pos, 1 / fps, axis=0),
        "body_ang_vel_w": ang_vel * fps,
    }
    path = Path(path)
    partial = path.with_name(
        f".{path.name}.{os.getpid()}.npz"
    )  # collectors sharing a folder never read a half-written file
    np.savez(partial, fps=np.array([fps]), **{k: v.astype(np.float32) for k, v in arrays.items()})
    os.replace(partial, path)
    return path
