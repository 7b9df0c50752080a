"""The third study's physics task: a harnessed MuJoCo walker tracking a reference gait."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.extras("torch", "mujoco", "gymnasium")


def _task(**kw):
    from redisync.study.task import TaskConfig

    return TaskConfig(**({"bins": 30, "skill_segments": 2} | kw))


def _pd(env) -> torch.Tensor:
    """A PD law toward the next reference frame that knows nothing of a segment's actuation."""
    nxt = np.minimum(env.frames_np + 1, env.num_frames - 1)
    q, dq = env.qpos[:, 1:], env.qvel[:, 1:]
    tgt, dtg = env.ref_q[env.profiles, nxt], env.ref_dq[env.profiles, nxt]
    return torch.from_numpy(np.clip(3.0 * (tgt - q) + 0.1 * (dtg - dq), -1, 1))


def test_the_harness_holds_the_torso_and_leaves_the_slide_and_the_legs_free():
    """Walker2d's model less rootz and rooty: 1 slide + 6 leg joints, 6 motors, the hip at HARNESS_Z."""
    from redisync.study.walker import HARNESS_Z, harnessed_walker

    model = harnessed_walker()
    names = [model.joint(i).name for i in range(model.njnt)]
    assert names == ["rootx", "thigh_joint", "leg_joint", "foot_joint", "thigh_left_joint", "leg_left_joint",
                     "foot_left_joint"]  # fmt: skip
    assert model.nu == 6
    assert model.body("torso").pos[2] == pytest.approx(HARNESS_Z)


def test_a_reset_places_each_walker_in_the_reference_pose_of_its_start_frame():
    """A reset places each walker in the reference pose of its start frame."""
    from redisync.study.walker import WalkerTracking

    env = WalkerTracking(_task(), torch.zeros(4, dtype=torch.long), seed=1)
    starts = torch.tensor([0, 100, 700, 1400])
    env.reset(torch.arange(4), starts)
    assert env.frames.tolist() == starts.tolist()
    assert np.abs(env.qpos[:, 1:] - env.ref_q[0, starts.numpy()]).max() < 0.1  # within the reset's noise
    assert env.observations().shape == (4, env.obs_dim)


def test_the_legs_meet_the_floor_while_tracking_the_gait():
    """Real contact: a stance foot touches the floor at some point of a gait cycle."""
    from redisync.study.walker import WalkerTracking

    env = WalkerTracking(_task(), torch.zeros(2, dtype=torch.long), seed=0)
    floor = env.model.geom("floor").id
    touched = 0
    for _ in range(100):
        env.step(_pd(env))
        touched += sum(any(floor in (d.contact[k].geom1, d.contact[k].geom2) for k in range(d.ncon)) for d in env.data)
    assert touched > 0


def test_failures_fall_in_the_skill_segments_for_a_policy_that_has_not_learnt_them():
    """What makes start frames matter: a PD law that knows the ordinary actuation tracks the gait,
    and loses the motion in the skill segments, where the motors answer another way."""
    from redisync.study.walker import WalkerTracking

    cfg = _task(seed=3)
    env = WalkerTracking(cfg, torch.zeros(64, dtype=torch.long), seed=0)
    g = torch.Generator().manual_seed(0)
    env.reset(torch.arange(64), torch.randint(0, env.num_frames, (64,), generator=g))
    per_bin = np.zeros(cfg.bins)
    for _ in range(600):
        out = env.step(_pd(env))
        np.add.at(per_bin, np.minimum(env.frames_np // 50, cfg.bins - 1)[out.terminated.numpy()], 1)
        done = (out.terminated | out.truncated).nonzero().squeeze(1)
        if len(done):
            env.reset(done, torch.randint(0, env.num_frames, (len(done),), generator=g))
    skill = env.skill_bins[0].numpy()
    assert per_bin[skill].sum() > 0
    assert per_bin[skill].sum() >= 5 * per_bin[~skill].sum()  # failures concentrate where the skill is


def test_the_same_seed_steps_the_same_walkers():
    """The same seed steps the same walkers, bit for bit."""
    from redisync.study.walker import WalkerTracking

    runs = []
    for _ in range(2):
        env = WalkerTracking(_task(), torch.zeros(3, dtype=torch.long), seed=5)
        torch.manual_seed(0)
        for _ in range(20):
            env.step(torch.rand(3, 6) * 2 - 1)
        runs.append(env.qpos.copy())
    assert np.array_equal(*runs)


def test_the_walker_plugs_into_the_study_as_an_env(tmp_path):
    """``--env redisync.study.walker:make_env``: a short run of the study's own pipeline trains on it."""
    from redisync.study.fleet import StudyConfig, run_arm
    from redisync.study.study import load_env_factory

    from .tiny import tiny

    cfg = tiny(StudyConfig().smoke(), env_steps=2_048, envs_per_shard=16, bins=6, hidden=32, batch_size=64)
    make_env = load_env_factory("redisync.study.walker:make_env", cfg)
    run = run_arm(cfg, "pooled", 1, None, make_env)
    assert run["curve"][-1]["env_steps"] >= 2_048
    assert 0.0 <= run["curve"][-1]["completion"] <= 1.0


def test_the_learnable_walker_fails_only_after_a_sustained_error():
    """With LEARNABLE's 0.2 s, an error past the tolerance ends the episode on its 10th frame, not its 1st;
    the third study's walker ends it on the first."""
    from redisync.study.walker import LEARNABLE, TOLERANCE, WalkerOptions, WalkerTracking

    for options, frames in ((LEARNABLE, 10), (WalkerOptions(), 1)):
        env = WalkerTracking(_task(), torch.zeros(1, dtype=torch.long), seed=0, options=options)
        env.ref_q = env.ref_q + 10 * TOLERANCE  # every frame's error far past the bound
        steps = 0
        while True:
            steps += 1
            if bool(env.step(torch.zeros(1, 6)).terminated[0]):
                break
            assert steps < 50
        assert steps == frames


def test_mild_segments_remap_fewer_motors_than_the_third_studys():
    """Each mild kind is a permutation with signs, moving 2 of the 6 motors; the third study's move 4 to 6."""
    from redisync.study.walker import actuation

    for kind in (1, 2, 3):
        mild, full = actuation(kind, mild=True), actuation(kind)
        for a in (mild, full):
            assert np.allclose(np.abs(a).sum(0), 1)
            assert np.allclose(np.abs(a).sum(1), 1)
        assert int((np.diag(mild) != 1).sum()) == 2
        assert int((np.diag(full) != 1).sum()) >= 4
