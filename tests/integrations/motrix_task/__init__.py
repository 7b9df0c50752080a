"""A whole-body-tracking-style task on MotrixLab's real manager framework, for the drop-in's tests.

Built on the installed ``motrix-env-core`` 0.4.0: the generic ``ManagerEnv`` (registered as the
env class, as MotrixLab registers its WBT tasks), a ``@kernel_data`` command term (frozen, slotted;
its arrays copied by ``canonicalize_kernel_data``), ``CommandTerm``, ``ResetContext``, ``@dispatch``
kernels, ``metric`` fields, the framework's observation and reward terms, and the motrixsim backend
with an empty scene. What MotrixLab's ``motrix_envs`` (not on PyPI) would bring is the command:
:class:`MotionCommand` is ours, written to the layout its published ``WbtMotionCommand`` declares —
the field names and dtypes (float32 ``adaptive_bin_failed_count``,
``adaptive_current_bin_failed_count``, ``sampling_cdf`` as shared arrays; ``uniform_ratio``,
``alpha``, ``kernel_size``, ``kernel_lambda``; per-env ``steps`` and ``clip_ended`` metrics), the
host-side order (``on_transition()`` folds the EMA after the transition kernel; ``reset(ctx)``
records the failures of ``ctx.terminated[env_ids]`` at their frames' bins and rebuilds the CDF from
``ema + uniform_ratio / bins``, smoothed by the kernel, cut past the last startable frame), and a
sampling kernel that draws bins from ``sampling_cdf`` in ``reset_env``. A motion is a frame count
here (no clip arrays): the policy acts one number, and inside a collector's hard segment of the
motion an episode fails unless that number is near the segment's target.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from motrix_env_core import registry
from motrix_env_core.config import configclass
from motrix_env_core.config.scene import SceneCfg
from motrix_env_core.manager import (
    ActionCfg,
    ActionState,
    ActionTerm,
    CommandCfg,
    CommandTerm,
    ManagerBasedEnvCfg,
    ManagerContext,
    ManagerEnv,
    SharedArray,
    TerminationTerm,
    TerminationTermCfg,
    dispatch,
    kernel_data,
    metric,
)
from motrix_env_core.mdp.observations import ActionsObsCfg, CommandObsCfg
from motrix_env_core.mdp.rewards import AliveRewardCfg
from motrix_env_core.numba.manager.commands import ResetContext
from numba import njit

from redisync.integrations.motrix import SyncedManagerEnv, collector_index, synced

NAME = "redisync-wbt"
FPS = 50
FRAMES = 500
# where the motion is hard, per collector index (the parent's probe and a lone env: the first);
# collectors that fail in different places make a pooled EMA visibly different from a local one
HARD_SEGMENTS = ((350, 450), (100, 200))


@njit(inline="always")
def _draw_step(rand, sampling_cdf, num_frames):
    """One start frame: a bin from the CDF, then a uniform offset inside it."""
    unit = (rand.next_uniform() + np.float32(1.0)) * np.float32(0.5)
    bin_id = np.int64(0)
    while bin_id + 1 < sampling_cdf.size and unit > sampling_cdf[bin_id]:
        bin_id += 1
    offset = (rand.next_uniform() + np.float32(1.0)) * np.float32(0.5)
    value = (np.float32(bin_id) + offset) / np.float32(sampling_cdf.size) * np.float32(num_frames)
    return np.int64(min(max(value, np.float32(0.0)), np.float32(num_frames - 2)))


def sampling_probabilities(ema: np.ndarray, uniform_ratio: float, kernel_size: int, kernel_lambda: float) -> np.ndarray:
    """``ema + uniform_ratio / bins``, smoothed by ``λʲ / Σλʲ`` over the next k − 1 bins (edge-padded), normalised."""
    bins = ema.size
    p = ema + np.float32(uniform_ratio) / bins
    if kernel_size > 1:
        kernel = np.float32(kernel_lambda) ** np.arange(kernel_size, dtype=np.float32)
        kernel /= kernel.sum()
        padded = np.concatenate([p, np.repeat(p[-1:], kernel_size - 1)])
        p = np.array([padded[i : i + kernel_size] @ kernel for i in range(bins)], dtype=p.dtype)
    total = p.sum()
    return np.full(bins, 1.0 / bins, np.float32) if total <= 0 else (p / total).astype(np.float32)


def command_cdf(
    ema: np.ndarray,
    num_frames: int = FRAMES,
    uniform_ratio: float = 0.1,
    kernel_size: int = 1,
    kernel_lambda: float = 0.8,
) -> np.ndarray:
    """The CDF :class:`MotionCommand` builds from ``ema`` (the tests' oracle)."""
    p = sampling_probabilities(np.asarray(ema, dtype=np.float32), uniform_ratio, kernel_size, kernel_lambda)
    max_bin = int(np.clip(np.ceil((num_frames - 1) * p.size / max(num_frames, 1)), 1, p.size))
    p = p.copy()
    p[max_bin:] = 0.0
    p = p / p.sum() if p.sum() > 0 else np.where(np.arange(p.size) < max_bin, 1.0 / max_bin, 0.0).astype(np.float32)
    cdf = np.cumsum(p, dtype=np.float32)
    cdf[-1] = 1.0
    return cdf


@kernel_data
class MotionCommand(CommandTerm):
    """A WBT-style motion command: a frame per env and an adaptive start-frame sampler."""

    num_frames: np.int64
    adaptive_bin_failed_count: SharedArray
    adaptive_current_bin_failed_count: SharedArray
    sampling_cdf: SharedArray
    uniform_ratio: np.float32
    alpha: np.float32
    kernel_size: np.int64
    kernel_lambda: np.float32
    steps: np.ndarray = metric(name="motion_step", dtype=np.float32)
    clip_ended: np.ndarray = metric()

    @dispatch
    def update(self, ctx: ManagerContext) -> None:
        phase = np.float32(self.steps[0]) / np.float32(self.num_frames)
        self.command[0] = np.float32(np.sin(np.float32(2 * np.pi) * phase))
        self.command[1] = np.float32(np.cos(np.float32(2 * np.pi) * phase))
        self.command[2] = phase

    @dispatch
    def advance(self, ctx: ManagerContext) -> None:
        self.steps[0] += 1
        self.clip_ended[0] = self.steps[0] >= self.num_frames
        if self.clip_ended[0]:
            self.steps[0] = _draw_step(ctx.rand, self.sampling_cdf, self.num_frames)
            ctx.sim_reset_requested[0] = True

    @dispatch
    def reset_env(self, ctx: ManagerContext) -> None:
        self.steps[0] = _draw_step(ctx.rand, self.sampling_cdf, self.num_frames)

    def reset(self, ctx: ResetContext) -> None:
        env_ids = ctx.env_ids
        failed = ctx.terminated[env_ids]
        bins = self.adaptive_bin_failed_count.size
        if np.any(failed):
            at = self.steps[env_ids, 0][failed].astype(np.int64)
            b = np.clip(at * bins // max(int(self.num_frames), 1), 0, bins - 1)
            self.adaptive_current_bin_failed_count[:] += np.bincount(b, minlength=bins).astype(np.float32)
        p = sampling_probabilities(
            self.adaptive_bin_failed_count, self.uniform_ratio, int(self.kernel_size), self.kernel_lambda
        )
        ctx.metrics["adaptive_failure_mass"] = float(np.sum(self.adaptive_bin_failed_count))
        max_bin = int(np.clip(np.ceil((self.num_frames - 1) * bins / max(int(self.num_frames), 1)), 1, bins))
        p = p.copy()
        p[max_bin:] = 0.0
        total = np.sum(p)
        if total <= 0.0:
            p[:max_bin] = 1.0 / max_bin
        else:
            p /= total
        self.sampling_cdf[:] = np.cumsum(p, dtype=np.float32)
        self.sampling_cdf[-1] = 1.0

    def on_transition(self) -> None:
        ema = self.adaptive_bin_failed_count
        ema[:] = self.alpha * self.adaptive_current_bin_failed_count + (np.float32(1.0) - self.alpha) * ema
        self.adaptive_current_bin_failed_count.fill(0.0)


@configclass(kw_only=True)
class MotionCommandCfg(CommandCfg):
    frames: int = FRAMES
    uniform_ratio: float = 0.1
    alpha: float = 0.01
    kernel_size: int = 1
    kernel_lambda: float = 0.8

    def __call__(self, env: ManagerEnv) -> MotionCommand:
        bins = self.frames // max(round(1.0 / env.cfg.ctrl_dt), 1) + 1
        return MotionCommand(
            command=np.zeros((env.num_envs, 3), dtype=np.float32),
            num_frames=np.int64(self.frames),
            adaptive_bin_failed_count=np.zeros(bins, dtype=np.float32),
            adaptive_current_bin_failed_count=np.zeros(bins, dtype=np.float32),
            sampling_cdf=np.ones(bins, dtype=np.float32),
            uniform_ratio=np.float32(self.uniform_ratio),
            alpha=np.float32(self.alpha),
            kernel_size=np.int64(self.kernel_size),
            kernel_lambda=np.float32(self.kernel_lambda),
            steps=np.zeros((env.num_envs, 1), dtype=np.int64),
            clip_ended=np.zeros((env.num_envs, 1), dtype=bool),
        )


class PhaseActionTerm(ActionTerm):
    """One number per env, recorded in the framework's action history; no actuator."""

    def _process(self, actions: np.ndarray) -> None:
        return None

    def _reset(self, env_ids: np.ndarray) -> None:
        pass


@configclass(kw_only=True)
class PhaseActionCfg(ActionCfg):
    actuator_names: tuple = ()

    def __call__(self, env: ManagerEnv, actuators) -> PhaseActionTerm:
        state = ActionState(
            action_queue=np.zeros((env.num_envs, 2, 1), dtype=np.float32), action_ptr=np.zeros(1, dtype=np.int64)
        )
        return PhaseActionTerm(gym.spaces.Box(-1.0, 1.0, (1,), np.float32), state)


@dispatch
def missed_hard_segment(ctx: ManagerContext, start: np.int64, end: np.int64) -> bool:
    step = ctx.commands["motion"].steps[0]
    action = ctx.actions["phase"].current()[0]
    return step >= start and step < end and abs(action - np.float32(0.8)) > np.float32(0.3)


@configclass(kw_only=True)
class MissedHardSegmentCfg(TerminationTermCfg):
    def __call__(self, ctx) -> TerminationTerm:
        start, end = HARD_SEGMENTS[(collector_index() or 0) % len(HARD_SEGMENTS)]
        return TerminationTerm(missed_hard_segment, np.int64(start), np.int64(end))


@configclass(kw_only=True)
class TrackingCfg(ManagerBasedEnvCfg):
    scene: SceneCfg = SceneCfg()
    ctrl_dt: float = 1 / FPS
    max_episode_seconds: float = 4.0

    def __post_init__(self) -> None:
        self.commands = {"motion": MotionCommandCfg()}
        self.actions = {"phase": PhaseActionCfg()}
        self.observations = {
            "policy": {"command": CommandObsCfg(command_name="motion"), "action": ActionsObsCfg(action_name="phase")}
        }
        self.rewards = {"alive": AliveRewardCfg(weight=1.0)}
        self.terminations = {"missed": MissedHardSegmentCfg()}


TRACE, KILL_AT = "REDISYNC_TEST_TRACE", "REDISYNC_TEST_KILL_AT"


class Traced:
    """Records, for the tests, what a collector sampled from (``$REDISYNC_TEST_TRACE`` set, in a
    collector): at every command reset the command's own EMA (before the reset: the reset does not
    change it), the CDF it built, the fleet part redisync held, the fleet version and the EMA array's
    address; the own EMA when saved (``final``). Saved to ``collector<i>.npz`` every 25 resets and at
    exit; when ``$REDISYNC_TEST_KILL_AT`` (``<index>:<resets>``) says, SIGKILLed there. Listed first,
    so it sees the reset from outside the sync hooks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        index = collector_index()
        self.trace_path = (
            Path(os.environ[TRACE]) / f"collector{index}.npz" if os.environ.get(TRACE) and index is not None else None
        )
        self.rows: dict[str, list] = {k: [] for k in ("cdf", "own", "fleet", "version", "time", "ptr")}
        kill = os.environ.get(KILL_AT, "")
        self.kill_at = (
            int(kill.split(":")[1]) if kill and index is not None and int(kill.split(":")[0]) == index else None
        )
        if self.trace_path is not None:
            atexit.register(self.save_trace)  # after the fleet's stop was registered: runs before it

    @property
    def motion(self) -> MotionCommand:
        return self.command_terms["motion"]

    def reset(self, env_ids, *args, **kwargs):
        own = self.motion.adaptive_bin_failed_count.copy()
        out = super().reset(env_ids, *args, **kwargs)
        if self.trace_path is None or not np.size(env_ids):
            return out
        ema = getattr(self, "redisync_ema", None)
        self.rows["cdf"].append(self.motion.sampling_cdf.copy())
        self.rows["own"].append(own)
        self.rows["fleet"].append(ema._fleet.copy() if ema is not None else np.zeros(own.size))
        self.rows["version"].append(ema.fleet_version if ema is not None else 0)
        self.rows["time"].append(time.time())
        self.rows["ptr"].append(self.motion.adaptive_bin_failed_count.__array_interface__["data"][0])
        n = len(self.rows["cdf"])
        if n % 25 == 0 or n == self.kill_at:
            self.save_trace()
        if n == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    def save_trace(self) -> None:
        if not self.rows["cdf"]:
            return
        tmp = self.trace_path.with_suffix(".tmp.npz")
        final = {"final": self.motion.adaptive_bin_failed_count.copy(), "saved_at": time.time()}
        np.savez(tmp, **{k: np.asarray(v) for k, v in self.rows.items()}, **final)
        os.replace(tmp, self.trace_path)


class TracedEnv(Traced, SyncedManagerEnv):
    """What a user registers (``SyncedManagerEnv``), traced."""


class TracedPlainEnv(Traced, ManagerEnv):
    """MotrixLab's plain ``ManagerEnv`` (no redisync), traced."""


class TracedBroadcastEnv(Traced, synced(ManagerEnv, mode="broadcast")):
    """The owner's (collector 0's) EMA for every collector."""


ENVS = {NAME: TracedEnv, f"{NAME}-plain": TracedPlainEnv, f"{NAME}-broadcast": TracedBroadcastEnv}


def register() -> None:
    """Register the task's names (once per process), as MotrixLab registers its WBT tasks: a config
    function under ``registry.envcfg`` and the env class under ``registry.env``."""
    for name, cls in ENVS.items():
        if not registry.contains(name):
            registry.envcfg(name)(TrackingCfg)
            registry.env(name)(cls)
