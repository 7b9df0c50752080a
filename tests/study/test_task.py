"""The toy studies' task (`redisync.study.task`): a point mass tracking a long motion with rare skill
segments, its observations and its conditions."""

from __future__ import annotations

import torch

from redisync.study.task import KINDS, SkillTracking, TaskConfig, TrackingEnv


def test_skill_segments_rotate_the_actuation_only_there():
    """A skill segment rotates the actuation inside its frames and nowhere else; segments are apart and after
    the start."""
    cfg = TaskConfig(bins=8, skill_segments=2, skill_angle_deg=90.0)
    env = SkillTracking(cfg, torch.zeros(2, dtype=torch.long))
    assert isinstance(env, TrackingEnv)
    assert env.num_frames == 8 * 50 - 1
    skill = env.kinds[0].nonzero().flatten()
    assert len(skill) == 2
    assert int(skill.min()) >= 2
    assert bool((skill.diff() > 1).all())
    plain, rotated = 0, int(skill[0]) * 50 + 10
    for start in (plain, rotated):
        env.reset(torch.arange(2), torch.tensor([start, start]))
        env.pos[:] = env.ref_pos[env.frames]
        env.vel[:] = 0.0
        env.step(torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
        push = env.vel[0] / (env.step_dt * cfg.max_force)
        kind = int(env.kinds[0, start // 50])
        want = torch.tensor([1.0, 0.0]) if kind == 0 else env.actuation[kind][:, 0]
        assert torch.allclose(push, want, atol=1e-5), (start, push, want)
        assert kind == 0 or abs(float(push[0])) < 1e-5  # ±90°: the force is perpendicular to the action


def test_a_policy_blind_to_the_skill_falls_in_the_first_skill_segment():
    """Every segment is trackable by a policy that inverts its actuation; a policy blind to the skill fails
    exactly in the first skill segment, where the sampler should look."""
    cfg = TaskConfig(bins=20, skill_segments=2)
    env = SkillTracking(cfg, torch.zeros(1, dtype=torch.long))
    first_skill = int(env.kinds[0].nonzero().min())

    def run(aware: bool) -> int:
        env.reset(torch.arange(1), torch.zeros(1, dtype=torch.long))
        for _ in range(env.num_frames - 1):
            f = env.frames
            acc = (env.ref_vel[(f + 1).clamp(max=env.num_frames - 1)] - env.ref_vel[f]) * 50
            want = (
                acc + cfg.damping * env.ref_vel[f] + 40 * (env.ref_pos[f] - env.pos) + 10 * (env.ref_vel[f] - env.vel)
            ) / cfg.max_force
            if aware:  # the inverse of the segment's actuation
                want = torch.linalg.solve(env.actuation[env.kind_of_frame[0, f]], want.unsqueeze(2)).squeeze(2)
            out = env.step(want)
            if bool(out.terminated[0]):
                return int(env.frames[0])
        return env.num_frames

    assert run(aware=True) == env.num_frames  # every segment is trackable
    assert run(aware=False) // 50 == first_skill  # the plain skill fails exactly there


def test_observations_show_the_segment_its_preview_and_the_profile():
    """The observation holds the current segment's kind, a preview of the next, and the env's profile."""
    cfg = TaskConfig(condition="X", bins=12, profiles=2, skill_segments=1, obs_offset=1.0)
    env = SkillTracking(cfg, torch.tensor([0, 1]))
    assert env.obs_dim == 12 + 2 * KINDS + 2
    skill = int(env.kinds[0].nonzero()[0])
    env.reset(torch.arange(2), torch.tensor([skill * 50 - 10, skill * 50 - 10]))  # 10 frames before profile 0's segment
    obs = env.observations()
    now, ahead, profile = obs[:, 12:16], obs[:, 16:20], obs[:, 20:22]
    assert int((now[0] - env.offset[0]).argmax()) == 0
    assert int((ahead[0] - env.offset[0]).argmax()) == int(env.kinds[0, skill])
    assert torch.allclose(profile - env.offset, torch.eye(2))  # the profile's one-hot, shifted by its offset
    assert env.offset.flatten().tolist() == [-0.5, 0.5]
    assert not torch.equal(env.kinds[0], env.kinds[1])  # X: each profile has skill segments of its own
    assert torch.allclose(obs[0, :2] - obs[1, :2], torch.tensor([-1.0, -1.0]), atol=0.2)  # the profile-specific offset


def test_h_has_one_profile_and_x_gives_each_profile_its_own_segments():
    """Condition H has one motion profile; condition X gives each profile its own skill segments."""
    h = TaskConfig(condition="H", profiles=4)
    x = TaskConfig(condition="X", profiles=3)
    assert h.layout().shape == (1, 120)
    assert x.layout().shape == (3, 120)
    assert (x.layout() > 0).sum(1).tolist() == [3, 3, 3]
