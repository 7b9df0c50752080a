"""The study's task: tracking a long motion whose rare skill segments each need data of their own.

A point mass in the plane follows a smooth reference (a Lissajous curve) for ``bins`` seconds at
50 Hz, driven by a bounded force. In a few one-second **skill segments** the actuation is rotated
(by ±θ, 90° by default): what the policy learnt everywhere else pushes the wrong way there, and only
data from that segment teaches the rotated mapping — skill does not transfer between segments. The
policy sees the current and the upcoming segment's kind (a preview) and its env profile, so every
segment is learnable. A fall (tracking error beyond the tolerance) ends the episode and is a failure
in its bin; episodes last ``episode_s`` from sampled starts.

Two fleet conditions (``condition``):

- ``H``: every env has the same skill segments (one profile): shards differ only by chance.
- ``X``: each env **profile** has skill segments of its own, at bins of its own; a shard runs one
  profile (the multi-terrain case), so shards fail in different bins for good reasons.

The primary metric is BeyondMimic's criterion: from frame 0, how much of the whole motion the
deterministic policy tracks before its first fall (``completion``, 1.0 = the whole motion).
All envs of a batch step together in one tensor operation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, runtime_checkable

import torch

from ..terms.torch.sampler import FPS, frames_for_bins

KINDS = 4  # 0 = plain segment; 1, 2, 3 = skill segments, the actuation rotated by +θ, −θ, +θ (the policy knows only the kind)
Condition = Literal["H", "X"]


class Step(NamedTuple):
    obs: torch.Tensor  # (num_envs, obs_dim), after the step (before any reset)
    reward: torch.Tensor  # (num_envs,)
    terminated: torch.Tensor  # (num_envs,) bool: a fall, counted as a failure in the env's current bin
    truncated: torch.Tensor  # (num_envs,) bool: time-out or end of the motion (not a failure)


@runtime_checkable
class TrackingEnv(Protocol):
    """A batch of tracking envs (one collector's shard). Bring your own: IsaacLab, mjlab, ...

    ``frames`` is the current reference frame of each env: the study's sampler turns it into the
    env's bin, records a failure there when ``terminated``, and hands `reset` the start
    frames it drew.
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
    """The motion, its skill segments and the fleet condition."""

    condition: Condition = "H"
    bins: int = 120  # a two-minute motion: three skill segments are 2.5 % of it
    profiles: int = 2  # X only: each profile has skill segments of its own (H has one profile)
    skill_segments: int = 3  # per profile
    skill_angle_deg: float = 90.0  # θ: how far a skill segment rotates the actuation
    skill_gain: float = 1.0  # the actuation's strength in a skill segment, as a share of max_force
    seed: int = 0
    amplitude: float = 0.5
    base_hz: float = 0.15
    max_force: float = 12.0
    damping: float = 1.0
    tolerance: float = 0.2
    sigma: float = 0.1
    episode_s: float = 10.0
    preview_s: float = 0.5
    obs_offset: float = 0.0  # X only: a profile-specific offset of the observations (for the normaliser arms)

    @property
    def num_frames(self) -> int:
        return frames_for_bins(self.bins)

    @property
    def num_profiles(self) -> int:
        return 1 if self.condition == "H" else self.profiles

    def layout(self) -> torch.Tensor:
        """``(profiles, bins)`` segment kinds, fixed by ``seed``: mostly 0, a few skill segments
        (never in the first two bins, never two in a row) whose kinds cycle through 1..3."""
        g = torch.Generator().manual_seed(20_000 + self.seed)
        kinds = torch.zeros(self.num_profiles, self.bins, dtype=torch.long)
        candidates = torch.arange(2, self.bins, 2)  # even bins from 2: skill segments never touch
        for p in range(self.num_profiles):
            bins = candidates[torch.randperm(len(candidates), generator=g)[: self.skill_segments]]
            for i, b in enumerate(sorted(bins.tolist())):
                kinds[p, b] = 1 + (i + p) % (KINDS - 1)
        return kinds


class SkillTracking:
    """A batch of point masses following the reference; env ``i`` runs profile ``profiles[i]``."""

    act_dim = 2
    step_dt = 1.0 / FPS

    def __init__(self, cfg: TaskConfig, profiles: torch.Tensor, seed: int = 0):
        self.cfg = cfg
        self.num_envs = int(profiles.numel())
        self.num_frames = cfg.num_frames
        self.profiles = profiles.long().clamp(max=cfg.num_profiles - 1)
        self.generator = torch.Generator().manual_seed(seed)
        self.kinds = cfg.layout()
        self.ref_pos, self.ref_vel = reference_motion(cfg)
        bin_of_frame = torch.arange(self.num_frames) * cfg.bins // self.num_frames
        self.kind_of_frame = self.kinds[:, bin_of_frame]  # (profiles, frames)
        theta = math.radians(cfg.skill_angle_deg)
        gains = (1.0,) + (cfg.skill_gain,) * (KINDS - 1)
        self.actuation = torch.tensor(
            [
                [g * math.cos(a), -g * math.sin(a), g * math.sin(a), g * math.cos(a)]
                for a, g in zip((0.0, theta, -theta, theta), gains, strict=False)
            ]
        ).view(KINDS, 2, 2)
        self.preview = int(cfg.preview_s * FPS)
        self.max_steps = int(cfg.episode_s * FPS)
        self.obs_dim = 12 + 2 * KINDS + cfg.num_profiles
        self.offset = cfg.obs_offset * (self.profiles.float() - (cfg.num_profiles - 1) / 2).unsqueeze(1)
        n = self.num_envs
        self.frames = torch.zeros(n, dtype=torch.long)
        self.age = torch.zeros(n, dtype=torch.long)
        self.pos = torch.zeros(n, 2)
        self.vel = torch.zeros(n, 2)
        self.reset(torch.arange(n), torch.zeros(n, dtype=torch.long))

    @property
    def skill_bins(self) -> torch.Tensor:
        """``(profiles, bins)`` bool: where the actuation is rotated."""
        return self.kinds > 0

    def reset(self, env_ids: torch.Tensor, start_frames: torch.Tensor) -> None:
        f = start_frames.clamp(0, self.num_frames - 1)
        self.frames[env_ids] = f
        self.age[env_ids] = 0
        self.pos[env_ids] = self.ref_pos[f] + 0.02 * torch.randn(len(env_ids), 2, generator=self.generator)
        self.vel[env_ids] = self.ref_vel[f]

    def observations(self) -> torch.Tensor:
        f, last = self.frames, self.num_frames - 1
        ahead = [self.ref_pos[(f + k).clamp(max=last)] - self.ref_pos[f] for k in (10, 25)]
        phase = 2 * math.pi * f.float() / self.num_frames
        kind_now = self.kind_of_frame[self.profiles, f]
        kind_next = self.kind_of_frame[self.profiles, (f + self.preview).clamp(max=last)]
        eye = torch.eye(KINDS)
        profile = torch.eye(self.cfg.num_profiles)[self.profiles]
        obs = torch.cat(
            [
                self.ref_pos[f] - self.pos,
                self.ref_vel[f] - self.vel,
                self.vel,
                *ahead,
                torch.stack([phase.sin(), phase.cos()], 1),
                eye[kind_now],
                eye[kind_next],
                profile,
            ],
            dim=1,
        )
        return obs + self.offset

    def step(self, actions: torch.Tensor) -> Step:
        cfg = self.cfg
        kind = self.kind_of_frame[self.profiles, self.frames]
        force = cfg.max_force * torch.bmm(self.actuation[kind], actions.clamp(-1, 1).unsqueeze(2)).squeeze(2)
        self.vel = self.vel + self.step_dt * (force - cfg.damping * self.vel)
        self.pos = self.pos + self.step_dt * self.vel
        self.frames = (self.frames + 1).clamp(max=self.num_frames - 1)
        self.age += 1
        err = (self.ref_pos[self.frames] - self.pos).norm(dim=1)
        reward = torch.exp(-((err / cfg.sigma) ** 2))
        terminated = err > cfg.tolerance
        truncated = ~terminated & ((self.age >= self.max_steps) | (self.frames >= self.num_frames - 1))
        return Step(self.observations(), reward, terminated, truncated)


def reference_motion(cfg: TaskConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions and velocities of a smooth Lissajous curve, ``bins`` seconds long."""
    t = torch.arange(cfg.num_frames, dtype=torch.float64) / FPS
    omega = 2 * math.pi * cfg.base_hz
    a = cfg.amplitude
    pos = torch.stack([a * (omega * t).sin(), a * (2 * omega * t + 0.5).sin()], 1)
    vel = torch.stack([a * omega * (omega * t).cos(), 2 * a * omega * (2 * omega * t + 0.5).cos()], 1)
    return pos.float(), vel.float()
