"""The study's tracking task, and the interface any tracking env must offer to join the study.

Modelled on whole-body tracking: a reference motion of ``T`` frames at 50 Hz, split into one-second
bins of differing difficulty, that a body must follow. Here the body is a damped point mass in the
plane driven by a bounded force; the reference is a Lissajous curve whose speed changes per bin.
Some bins are hard for everybody (fast segments with a tighter tolerance); each perturbation
*profile* adds random pushes in bins of its own — as when collectors load different perturbation
settings — so shards that own different profiles fail in different bins, and unsynced sampling
distributions drift apart. All envs of a batch step together in one tensor operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from ..sampler import FPS, frames_for_bins


class Step(NamedTuple):
    obs: torch.Tensor  # (num_envs, obs_dim), after the step (before any reset)
    reward: torch.Tensor  # (num_envs,)
    terminated: torch.Tensor  # (num_envs,) bool: a fall, counted as a failure in the env's current bin
    truncated: torch.Tensor  # (num_envs,) bool: time-out or end of the motion (not a failure)


@runtime_checkable
class TrackingEnv(Protocol):
    """A batch of tracking envs (one collector's shard). Bring your own: IsaacLab, mjlab, ...

    ``frames`` is the current reference frame of each env: the study's sampler turns it into the
    env's bin (``frame * bin_count // num_frames``), records a failure there when ``terminated``,
    and hands :meth:`reset` the start frames it drew.
    """

    num_envs: int
    obs_dim: int
    act_dim: int
    num_frames: int
    step_dt: float
    frames: torch.Tensor

    def reset(self, env_ids: torch.Tensor, start_frames: torch.Tensor) -> None: ...

    def observations(self) -> torch.Tensor: ...

    def step(self, actions: torch.Tensor) -> Step: ...


@dataclass(frozen=True)
class TaskConfig:
    """The motion and its difficulty. ``heterogeneity`` in [0, 1] moves pushes from bins every
    profile shares (0) to bins of each profile's own (1)."""

    bins: int = 20
    profiles: int = 4
    heterogeneity: float = 1.0
    seed: int = 0
    amplitude: float = 0.5
    base_hz: float = 0.2
    fast_speed: float = 2.0
    max_force: float = 15.0
    damping: float = 1.0
    tolerance: float = 0.25
    tight_tolerance: float = 0.1
    sigma: float = 0.1
    push_prob: float = 0.1
    push_speed: float = 1.5
    hard_fraction: float = 0.2
    push_fraction: float = 0.2
    episode_s: float = 5.0

    @property
    def num_frames(self) -> int:
        return frames_for_bins(self.bins)

    def layout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(hard bins as a bool mask, per-profile push probability per bin), fixed by ``seed``."""
        g = torch.Generator().manual_seed(10_000 + self.seed)
        n_hard = max(1, round(self.hard_fraction * self.bins))
        hard = torch.zeros(self.bins, dtype=torch.bool)
        hard[torch.randperm(self.bins, generator=g)[:n_hard]] = True
        n_push = max(1, round(self.push_fraction * self.bins))
        shared = torch.zeros(self.bins)
        shared[torch.randperm(self.bins, generator=g)[:n_push]] = 1.0
        own = torch.zeros(self.profiles, self.bins)
        for p in range(self.profiles):
            own[p, torch.randperm(self.bins, generator=g)[:n_push]] = 1.0
        push = self.push_prob * ((1 - self.heterogeneity) * shared + self.heterogeneity * own)
        return hard, push


class PointMassTracking:
    """A batch of point masses following the reference; env ``i`` is pushed by profile ``profiles[i]``."""

    obs_dim = 12
    act_dim = 2
    step_dt = 1.0 / FPS

    def __init__(self, cfg: TaskConfig, profiles: torch.Tensor, seed: int = 0):
        self.cfg = cfg
        self.num_envs = int(profiles.numel())
        self.num_frames = cfg.num_frames
        self.profiles = profiles.long()
        self.generator = torch.Generator().manual_seed(seed)
        self.hard_bins, push = cfg.layout()
        self.ref_pos, self.ref_vel = reference_motion(cfg, self.hard_bins)
        bin_of_frame = torch.arange(self.num_frames) * cfg.bins // self.num_frames
        self.tol_of_frame = torch.where(self.hard_bins[bin_of_frame], cfg.tight_tolerance, cfg.tolerance)
        self.push_of_frame = push[:, bin_of_frame]  # (profiles, frames)
        self.max_steps = int(cfg.episode_s * FPS)
        n = self.num_envs
        self.frames = torch.zeros(n, dtype=torch.long)
        self.age = torch.zeros(n, dtype=torch.long)
        self.pos = torch.zeros(n, 2)
        self.vel = torch.zeros(n, 2)
        self.reset(torch.arange(n), torch.zeros(n, dtype=torch.long))

    def reset(self, env_ids: torch.Tensor, start_frames: torch.Tensor) -> None:
        f = start_frames.clamp(0, self.num_frames - 1)
        self.frames[env_ids] = f
        self.age[env_ids] = 0
        self.pos[env_ids] = self.ref_pos[f] + 0.02 * torch.randn(len(env_ids), 2, generator=self.generator)
        self.vel[env_ids] = self.ref_vel[f]

    def observations(self) -> torch.Tensor:
        f = self.frames
        last = self.num_frames - 1
        ahead = [self.ref_pos[(f + k).clamp(max=last)] - self.ref_pos[f] for k in (10, 25)]
        phase = 2 * math.pi * f.float() / self.num_frames
        return torch.cat([self.ref_pos[f] - self.pos, self.ref_vel[f] - self.vel, self.vel, *ahead,
                          torch.stack([phase.sin(), phase.cos()], 1)], dim=1)

    def step(self, actions: torch.Tensor) -> Step:
        cfg = self.cfg
        force = cfg.max_force * actions.clamp(-1, 1)
        self.vel = self.vel + self.step_dt * (force - cfg.damping * self.vel)
        pushed = torch.rand(self.num_envs, generator=self.generator) < self.push_of_frame[self.profiles, self.frames]
        if bool(pushed.any()):
            angle = 2 * math.pi * torch.rand(int(pushed.sum()), generator=self.generator)
            self.vel[pushed] += cfg.push_speed * torch.stack([angle.cos(), angle.sin()], 1)
        self.pos = self.pos + self.step_dt * self.vel
        self.frames = (self.frames + 1).clamp(max=self.num_frames - 1)
        self.age += 1
        err = (self.ref_pos[self.frames] - self.pos).norm(dim=1)
        reward = torch.exp(-(err / cfg.sigma) ** 2)
        terminated = err > self.tol_of_frame[self.frames]
        truncated = ~terminated & ((self.age >= self.max_steps) | (self.frames >= self.num_frames - 1))
        return Step(self.observations(), reward, terminated, truncated)


def reference_motion(cfg: TaskConfig, hard: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and velocities of a Lissajous curve whose speed is ``fast_speed``× in the hard bins.

    The speed eases from bin to bin over a quarter second so the reference stays smooth.
    """
    frames = torch.arange(cfg.num_frames)
    speed = torch.where(hard, cfg.fast_speed, 1.0)[frames * cfg.bins // cfg.num_frames].double()
    k = FPS // 4
    speed = torch.nn.functional.avg_pool1d(speed.view(1, 1, -1), k, 1, k // 2, count_include_pad=False).view(-1)[: len(frames)]
    omega = 2 * math.pi * cfg.base_hz * speed
    phase = torch.cumsum(omega / FPS, 0)
    a = cfg.amplitude
    pos = torch.stack([a * phase.sin(), a * (2 * phase + 0.5).sin()], 1)
    vel = torch.stack([a * omega * phase.cos(), 2 * a * omega * (2 * phase + 0.5).cos()], 1)
    return pos.float(), vel.float()
