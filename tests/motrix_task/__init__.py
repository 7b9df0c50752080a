"""A small numpy tracking task for MotrixLab's FastSAC, with an adaptive start-frame sampler
written the way MotrixLab's ``WbtMotionCommand`` keeps one (from its published source: float32
arrays a compiled kernel reads, so updated in place; the EMA folded once per transition; failures
recorded and the CDF rebuilt at reset with ``ema + ε/B``). Ours, not MotrixLab's: the tests run
redisync's motrix drop-in inside the real async trainer on it.

The task: follow a reference phase with one action; inside the motion's hard segment the error
grows fast and an episode fails there unless the policy has learnt the segment's target.
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numba
import numpy as np
from motrix_env_core import registry
from motrix_env_core.array.env import ArrayEnv
from motrix_env_core.base import EnvCfg
from motrix_env_core.config import configclass
from motrix_env_core.config.scene import SceneCfg

from redisync.integrations.motrix import SyncedAdaptiveSampling, collector_index

NAME = "redisync-tracking"
FPS = 50


@numba.njit(cache=False)
def _draw_starts(cdf, bins, frames, u, offset, out):
    """The kernel: start frames from the CDF it was handed at construction (kernel data)."""
    for i in range(u.shape[0]):
        b = np.searchsorted(cdf, u[i], side="right")
        if b > bins - 1:
            b = bins - 1
        out[i] = int((b + offset[i]) / bins * (frames - 1))


@dataclass
class ResetContext:
    env_ids: np.ndarray
    failed: np.ndarray  # per reset env: terminated (not truncated)
    time_steps: np.ndarray  # per reset env: the frame it ended at


class TrackingCommand:
    """The motion command: a WBT-style adaptive start-frame sampler over one motion."""

    def __init__(self, num_envs: int, frames: int, *, alpha: float, uniform_ratio: float, seed: int):
        self.frames, self.alpha, self.uniform_ratio = frames, alpha, uniform_ratio
        self.bins = frames // FPS + 1
        self.adaptive_bin_failed_count = np.zeros(self.bins, dtype=np.float32)
        self.adaptive_current_bin_failed_count = np.zeros(self.bins, dtype=np.float32)
        self.sampling_cdf = np.zeros(self.bins, dtype=np.float32)
        self.time_steps = np.zeros(num_envs, dtype=np.int64)
        self.rng = np.random.default_rng(seed)
        # the kernel's data: these very arrays, for the life of the command
        self._kernel_data = (self.sampling_cdf, self.bins, self.frames)
        self.draws = 0  # start frames drawn (a test reads the distribution they came from)
        self._rebuild_cdf()

    def _rebuild_cdf(self) -> None:
        p = self.adaptive_bin_failed_count + np.float32(self.uniform_ratio / self.bins)
        c = np.cumsum(p / p.sum())
        self.sampling_cdf[:] = c / c[-1]

    def on_transition(self) -> None:
        ema = self.adaptive_bin_failed_count
        ema *= np.float32(1 - self.alpha)
        ema += np.float32(self.alpha) * self.adaptive_current_bin_failed_count
        self.adaptive_current_bin_failed_count[:] = 0

    def reset(self, ctx: ResetContext) -> None:
        if ctx.failed.any():
            b = np.clip(ctx.time_steps[ctx.failed] * self.bins // max(self.frames, 1), 0, self.bins - 1)
            self.adaptive_current_bin_failed_count += np.bincount(b, minlength=self.bins).astype(np.float32)
        self._rebuild_cdf()
        n = ctx.env_ids.shape[0]
        out = np.empty(n, dtype=np.int64)
        _draw_starts(
            *self._kernel_data[:1],
            self._kernel_data[1],
            self._kernel_data[2],
            self.rng.random(n),
            self.rng.random(n),
            out,
        )
        self.time_steps[ctx.env_ids] = out
        self.draws += n


TRACE, KILL_AT = "REDISYNC_TEST_TRACE", "REDISYNC_TEST_KILL_AT"


class Trace:
    """What a collector sampled from, for the tests: at every reset the CDF its command drew from,
    its own EMA and the fleet part redisync held, and the own EMA when saved (``final``; saved to ``$REDISYNC_TEST_TRACE/collector<i>.npz``
    every few resets, and when ``$REDISYNC_TEST_KILL_AT`` (``<index>:<resets>``) says, SIGKILLed there)."""

    def __init__(self, env: "TrackingEnv"):
        self.env, self.path = env, Path(os.environ[TRACE]) / f"collector{env.index}.npz"
        self.rows: dict[str, list] = {"cdf": [], "own": [], "fleet": [], "version": [], "time": []}
        kill = os.environ.get(KILL_AT, "")
        self.kill_at = int(kill.split(":")[1]) if kill and int(kill.split(":")[0]) == env.index else None
        atexit.register(self.save)  # after the fleet's stop was registered: runs before it, nothing stepped between

    def record(self) -> None:
        ema = getattr(self.env, "redisync_ema", None)
        self.rows["cdf"].append(self.env.command.sampling_cdf.copy())
        self.rows["own"].append(self.env.command.adaptive_bin_failed_count.copy())
        self.rows["fleet"].append(ema._fleet.copy() if ema is not None else np.zeros(self.env.command.bins))
        self.rows["version"].append(ema.fleet_version if ema is not None else 0)
        self.rows["time"].append(time.time())
        if len(self.rows["cdf"]) % 25 == 0 or len(self.rows["cdf"]) == self.kill_at:
            self.save()
        if len(self.rows["cdf"]) == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp.npz")
        final = {"final": self.env.command.adaptive_bin_failed_count.copy(), "saved_at": time.time()}
        np.savez(tmp, **{k: np.asarray(v) for k, v in self.rows.items()}, **final)
        os.replace(tmp, self.path)


@configclass
class TrackingCfg(EnvCfg):
    scene: SceneCfg = SceneCfg()
    ctrl_dt: float = 1 / FPS
    max_episode_seconds: float = 4.0
    frames: int = 500
    # where the motion is hard, per collector index (the parent's probe and a lone env: the first);
    # collectors that fail in different places make a pooled EMA visibly different from a local one
    hard_segments: tuple = ((350, 450), (100, 200))
    alpha: float = 0.01
    uniform_ratio: float = 0.1


class TrackingEnv(ArrayEnv[TrackingCfg]):
    """The plain env (no redisync): what MotrixLab's own WBT command does, per collector."""

    def __init__(self, cfg: TrackingCfg, num_envs: int = 1):
        super().__init__(cfg, num_envs)
        seed = int(os.environ.get("REDISYNC_TEST_SEED", "0")) + os.getpid()
        self.command = TrackingCommand(
            num_envs, cfg.frames, alpha=cfg.alpha, uniform_ratio=cfg.uniform_ratio, seed=seed
        )
        self.error = np.zeros(num_envs, dtype=np.float32)
        self.index = collector_index()
        self.hard = cfg.hard_segments[(self.index or 0) % len(cfg.hard_segments)]
        self.trace = Trace(self) if os.environ.get(TRACE) and self.index is not None else None
        self._obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self._act_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    @property
    def observation_space(self):
        return self._obs_space

    @property
    def action_space(self):
        return self._act_space

    def create_renderer(self, config):
        raise NotImplementedError("the test task renders nothing")

    def physics_step(self):
        pass

    def _target(self, t: np.ndarray) -> np.ndarray:
        hard = (t >= self.hard[0]) & (t < self.hard[1])
        return np.where(hard, 0.8, 0.0).astype(np.float32), hard

    def apply_action(self, actions, state):
        t = self.command.time_steps
        target, hard = self._target(t)
        miss = np.abs(actions[:, 0] - target)
        self.error = np.float32(0.9) * self.error + miss * np.where(hard, 3.0, 0.5).astype(np.float32)
        state.reward[:] = -miss
        return state

    def compute_transition(self, state):
        self.command.time_steps += 1
        ended = self.command.time_steps >= self.cfg.frames - 1
        state.terminated[:] = self.error > 1.5
        state.truncated[:] = ended & ~state.terminated
        self.command.on_transition()
        return state

    def reset(self, env_ids):
        state = self.state
        failed = state.terminated[env_ids].copy()
        self.command.reset(ResetContext(env_ids, failed, self.command.time_steps[env_ids].copy()))
        self.error[env_ids] = 0
        if self.trace is not None:
            self.trace.record()

    def compute_observation(self, state):
        t = self.command.time_steps.astype(np.float32) / self.cfg.frames
        state.obs.policy[:, 0] = np.sin(2 * np.pi * t)
        state.obs.policy[:, 1] = np.cos(2 * np.pi * t)
        state.obs.policy[:, 2] = t
        state.obs.policy[:, 3] = self.error
        return state


class SyncedTrackingEnv(SyncedAdaptiveSampling, TrackingEnv):
    """The same env, its command's sampler synced across the async trainer's collectors: one mixin."""


class BroadcastTrackingEnv(SyncedTrackingEnv):
    redisync_mode = "broadcast"


class ExpiringTrackingEnv(SyncedTrackingEnv):
    """Pooled, a collector's EMA dropped from the pool 2 s after its last publish."""

    redisync_stale_after_s = 2.0


ENVS = {
    NAME: SyncedTrackingEnv,
    f"{NAME}-plain": TrackingEnv,
    f"{NAME}-broadcast": BroadcastTrackingEnv,
    f"{NAME}-expiring": ExpiringTrackingEnv,
}


def register() -> None:
    """Register the task's env names (once per process)."""
    for name, cls in ENVS.items():
        if not registry.contains(name):
            registry.register_env_config(name, TrackingCfg)
            registry.register_env(name, cls)
