"""The third study's task: a planar MuJoCo walker tracking a two-minute reference gait.

Real rigid-body physics on the CPU: gymnasium's Walker2d model (its MJCF, as ``gymnasium[mujoco]``
ships it), stepped by ``mujoco`` at 50 Hz (four 5 ms steps per control step). The walker hangs in a
harness, as on a treadmill: the torso's height and pitch are held (the model's ``rootz`` and ``rooty``
joints removed, the hip at `HARNESS_Z`), its forward slide is free, and its legs meet the floor
with contact and friction, so a stance leg pushes against the ground. Six motors (the model's gear of
100 and control range of ±1) drive the hips, knees and ankles.

The reference is a synthesised walking gait of ``bins`` seconds (one bin a second, `FPS` frames
each), with a few rare one-second **skill segments** (a kick, a crouch, fast steps). As in the toy
task, skill does not transfer between segments: in a skill segment the motors answer the commands
another way (kind 1 swaps each leg's hip and knee commands, kind 2 reverses every command, kind 3 swaps
the legs), so what the policy learnt elsewhere pushes the wrong way there and only data from those
seconds teaches it. Where they lie comes from
the task's seed and, in condition ``X``, from the env's profile (``TaskConfig.layout()``, as the toy
task's). The policy sees its joints, the reference now and ahead, and the current and upcoming
segment's kind. A **failure** is a tracking error past `TOLERANCE` (the mean absolute joint error,
radians): the episode ends and a failure counts in the env's current bin. Episodes last
``episode_s`` from sampled start frames, the walker placed in the reference pose of that frame.

It plugs into the study as ``--env redisync.study.walker:make_env`` (`make_env`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigurationError
from ..terms.torch.sampler import FPS
from .task import KINDS, Step, TaskConfig

SUBSTEPS = 4  # physics steps per control step
TIMESTEP = 1.0 / (FPS * SUBSTEPS)  # 5 ms
HARNESS_Z = 1.20  # the hip's height: a straight leg reaches the floor, a bent one clears it
TOLERANCE = 0.35  # rad: the mean absolute joint error past which the walker has lost the motion
SIGMA = 0.15  # rad: the reward's width
JOINTS = 6  # right thigh, leg, foot; left thigh, leg, foot
AHEAD = (5, 15)  # frames of the reference the policy previews (0.1 s, 0.3 s)


def _model_path() -> str:
    try:
        import gymnasium
    except ImportError:
        raise ConfigurationError(
            "the walker task needs gymnasium's MuJoCo models and mujoco: pip install 'gymnasium[mujoco]'"
        ) from None
    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", "walker2d_v5.xml")


def harnessed_walker() -> Any:
    """Walker2d's model with the torso's height and pitch held (rootz and rooty removed) at HARNESS_Z."""
    import mujoco

    spec = mujoco.MjSpec.from_file(_model_path())
    for name in ("rootz", "rooty"):
        spec.delete(spec.joint(name))
    spec.body("torso").pos = [0.0, 0.0, HARNESS_Z]
    spec.option.timestep = TIMESTEP
    model = spec.compile()
    assert model.nq == 1 + JOINTS, model.nq
    assert model.nu == JOINTS, model.nu
    return model


@dataclass(frozen=True)
class WalkerOptions:
    """What differs between the walker of the third study (the defaults) and the learnable one
    (`LEARNABLE`): how a failure is called and how far a skill segment remaps the motors."""

    sustain_s: float = 0.0  # a failure: the error past TOLERANCE for this long (0: the first frame past it)
    mild: bool = False  # mild skill segments: one leg's hip and knee swapped
    crouch: bool = True  # kind 2's motion: a deep crouch, or (False) a kick of the left leg


# learnability pilots 1 and 2 learnt the kick and never the crouch (docs/ab/fourth-study/pilots.md)
LEARNABLE = WalkerOptions(sustain_s=0.2, mild=True, crouch=False)


def actuation(kind: int, mild: bool = False) -> np.ndarray:
    """``(6, 6)``: the motor commands a policy's action becomes in a segment of ``kind``. Mild
    segments remap two motors: kind 1 swaps the right leg's hip and knee, kind 2 the two hips, kind 3
    the ankles. (Learnability pilots 1 and 2 tried, in kind 2's crouch, both knees reversed and the
    left leg's hip and knee swapped: neither was learnt, docs/ab/fourth-study/pilots.md.)"""
    order, sign = list(range(JOINTS)), np.ones(JOINTS)
    if kind == 1:
        order = [1, 0, 2, 3, 4, 5] if mild else [1, 0, 2, 4, 3, 5]
    elif kind == 2:
        if mild:
            order = [3, 1, 2, 0, 4, 5]
        else:
            sign = -sign
    elif kind == 3:
        order = [0, 1, 5, 3, 4, 2] if mild else [3, 4, 5, 0, 1, 2]
    return np.eye(JOINTS)[order] * sign[:, None]


def _bump(x: np.ndarray) -> np.ndarray:
    """0 at the segment's edges, 1 in its middle, smooth: a skill's targets blend in and out."""
    return np.sin(np.pi * np.clip(x, 0.0, 1.0)) ** 2


def reference_gait(bins: int, kinds: np.ndarray, crouch: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Joint targets ``(frames, 6)`` and their velocities, for one profile's segment ``kinds`` (bins,);
    kind 2 is a deep crouch, or without ``crouch`` a kick of the left leg (the learnable walker's)."""
    frames = bins * FPS + 1
    t = np.arange(frames) / FPS
    seg = np.minimum((t // 1.0).astype(int), bins - 1)
    within = t - seg
    kind = kinds[seg]
    # the ordinary gait at 1 Hz; fast steps (kind 3) run at 2.5 Hz with half the stride
    fast = (kind == 3) * _bump(within)
    phase = 2 * np.pi * np.cumsum(1.0 + 1.5 * fast) / FPS
    stride = 1.0 - 0.5 * fast
    q = np.zeros((frames, JOINTS))
    for side, shift in ((0, 0.0), (3, np.pi)):
        p = phase + shift
        q[:, side + 0] = -0.40 - 0.35 * stride * np.sin(p)  # hip (its range: -150° to 0)
        q[:, side + 1] = -0.15 - 0.45 * stride * (1 + np.cos(p + 0.6)) / 2  # knee
        q[:, side + 2] = 0.25 * stride * np.sin(p + 1.0)  # ankle
    kick = (kind == 1) * _bump(within)  # the right leg kicks forward, straight
    q[:, 0] += kick * (-1.30 - q[:, 0])
    q[:, 1] += kick * (-0.05 - q[:, 1])
    second = (kind == 2) * _bump(within)
    if crouch:  # both knees bend deep, the hips follow
        for side in (0, 3):
            q[:, side + 0] += second * (-1.10 - q[:, side + 0])
            q[:, side + 1] += second * (-1.60 - q[:, side + 1])
    else:  # the left leg kicks forward, straight
        q[:, 3] += second * (-1.30 - q[:, 3])
        q[:, 4] += second * (-0.05 - q[:, 4])
    dq = np.gradient(q, 1.0 / FPS, axis=0)
    return q, dq


class WalkerTracking:
    """A batch of harnessed walkers tracking the reference gait; env ``i`` runs profile ``profiles[i]``."""

    act_dim = JOINTS
    step_dt = 1.0 / FPS

    def __init__(
        self, cfg: TaskConfig, profiles: torch.Tensor, seed: int = 0, options: WalkerOptions = WalkerOptions()
    ):
        import mujoco

        self._mujoco = mujoco
        self.cfg, self.options = cfg, options
        self.sustain = max(1, round(options.sustain_s * FPS))  # frames past the tolerance that make a failure
        self.num_envs = int(profiles.numel())
        self.profiles = profiles.long().clamp(max=cfg.num_profiles - 1).numpy()
        self.kinds = cfg.layout().numpy()  # (profiles, bins)
        gaits = [reference_gait(cfg.bins, self.kinds[p], options.crouch) for p in range(cfg.num_profiles)]
        self.ref_q = np.stack([g[0] for g in gaits])  # (profiles, frames, 6)
        self.ref_dq = np.stack([g[1] for g in gaits])
        self.num_frames = self.ref_q.shape[1]
        bin_of_frame = np.minimum(np.arange(self.num_frames) // FPS, cfg.bins - 1)
        self.kind_of_frame = self.kinds[:, bin_of_frame]  # (profiles, frames)
        self.preview = int(cfg.preview_s * FPS)
        self.max_steps = int(cfg.episode_s * FPS)
        self.obs_dim = 1 + 2 * JOINTS + JOINTS + JOINTS * len(AHEAD) + 2 + 2 * KINDS + cfg.num_profiles
        self.actuation = np.stack([actuation(k, options.mild) for k in range(KINDS)])  # (kinds, 6, 6)
        self.rng = np.random.default_rng(seed)
        self.model = harnessed_walker()
        self.data = [mujoco.MjData(self.model) for _ in range(self.num_envs)]
        n = self.num_envs
        self.qpos = np.zeros((n, self.model.nq))
        self.qvel = np.zeros((n, self.model.nv))
        self.frames_np: np.ndarray = np.zeros(n, dtype=np.int64)
        self.age = np.zeros(n, dtype=np.int64)
        self.over: np.ndarray = np.zeros(n, dtype=np.int64)  # consecutive frames past the tolerance
        self.reset(torch.arange(n), torch.zeros(n, dtype=torch.long))

    @property
    def frames(self) -> torch.Tensor:
        return torch.from_numpy(self.frames_np)

    @property
    def skill_bins(self) -> torch.Tensor:
        return torch.from_numpy(self.kinds > 0)

    def reset(self, env_ids: torch.Tensor, start_frames: torch.Tensor) -> None:
        ids = env_ids.numpy()
        f = start_frames.clamp(0, self.num_frames - 1).numpy()
        self.frames_np[ids] = f
        self.age[ids] = 0
        self.over[ids] = 0
        prof = self.profiles[ids]
        q = self.ref_q[prof, f] + 0.02 * self.rng.standard_normal((len(ids), JOINTS))
        for k, i in enumerate(ids):
            d = self.data[i]
            self._mujoco.mj_resetData(self.model, d)
            d.qpos[1:] = q[k]
            d.qvel[1:] = self.ref_dq[prof[k], f[k]]
            self._mujoco.mj_forward(self.model, d)
            self.qpos[i], self.qvel[i] = d.qpos, d.qvel

    def observations(self) -> torch.Tensor:
        f, last, prof = self.frames_np, self.num_frames - 1, self.profiles
        ref = self.ref_q[prof, f]
        ahead = [self.ref_q[prof, np.minimum(f + k, last)] - ref for k in AHEAD]
        phase = 2 * math.pi * f / self.num_frames
        eye = np.eye(KINDS)
        obs = np.concatenate(
            [
                self.qvel[:, :1] * 0.5,  # the forward slide's speed
                self.qpos[:, 1:],
                0.1 * self.qvel[:, 1:],
                ref - self.qpos[:, 1:],
                *ahead,
                np.stack([np.sin(phase), np.cos(phase)], 1),
                eye[self.kind_of_frame[prof, f]],
                eye[self.kind_of_frame[prof, np.minimum(f + self.preview, last)]],
                np.eye(self.cfg.num_profiles)[prof],
            ],
            axis=1,
        )
        return torch.from_numpy(obs).float()

    def step(self, actions: torch.Tensor) -> Step:
        kind = self.kind_of_frame[self.profiles, self.frames_np]
        ctrl = np.einsum("nij,nj->ni", self.actuation[kind], actions.detach().clamp(-1, 1).double().numpy())
        step = self._mujoco.mj_step
        for i, d in enumerate(self.data):
            d.ctrl[:] = ctrl[i]
            step(self.model, d, SUBSTEPS)
            self.qpos[i], self.qvel[i] = d.qpos, d.qvel
        self.frames_np = np.minimum(self.frames_np + 1, self.num_frames - 1)
        self.age += 1
        err = np.abs(self.ref_q[self.profiles, self.frames_np] - self.qpos[:, 1:]).mean(axis=1)
        reward = np.exp(-((err / SIGMA) ** 2))
        self.over = np.where(err > TOLERANCE, self.over + 1, 0)
        terminated = self.over >= self.sustain
        truncated = ~terminated & ((self.age >= self.max_steps) | (self.frames_np >= self.num_frames - 1))
        return Step(
            self.observations(),
            torch.from_numpy(reward).float(),
            torch.from_numpy(terminated),
            torch.from_numpy(truncated),
        )


# the fields of TaskConfig the walker reads; the others (the toy's force, damping, tolerance, ...) it ignores
TASK_FIELDS = ("condition", "bins", "profiles", "skill_segments", "seed", "episode_s", "preview_s")


def task_record(task: TaskConfig, options: WalkerOptions = WalkerOptions(), env: str = "make_env") -> dict[str, Any]:
    """What a run file records of the walker's task: the TaskConfig fields it reads, its options and constants."""
    fields = {name: getattr(task, name) for name in TASK_FIELDS} | asdict(options)
    constants = {
        "tolerance_rad": TOLERANCE,
        "sigma_rad": SIGMA,
        "substeps": SUBSTEPS,
        "harness_z": HARNESS_Z,
        "fps": FPS,
        "ahead_frames": list(AHEAD),
    }
    return {"env": f"redisync.study.walker:{env}", **fields, **constants}


def make_env(task: TaskConfig) -> Callable[[torch.Tensor, int], WalkerTracking]:
    """The third study's ``--env`` factory: ``redisync ab --env redisync.study.walker:make_env``."""
    return lambda profiles, seed: WalkerTracking(task, profiles, seed)


def make_learnable_env(task: TaskConfig) -> Callable[[torch.Tensor, int], WalkerTracking]:
    """The fourth study's factory: mild skill segments, a failure only after a sustained error (`LEARNABLE`)."""
    return lambda profiles, seed: WalkerTracking(task, profiles, seed, LEARNABLE)
