"""The study's SAC learner (`redisync.study.learner`): its replay buffer, a bandit it must learn, and
gymnasium's Pendulum (`redisync.study.pendulum`) it must solve."""

from __future__ import annotations

import pytest
import torch

from redisync.study.learner import SAC, ReplayBuffer, SACConfig


def test_the_replay_buffer_wraps_around_and_keeps_the_newest():
    """The replay buffer wraps around and keeps the newest transitions."""
    buf = ReplayBuffer(5, 1, 1)
    for i in range(3):
        x = torch.full((2, 1), float(i))
        buf.add(x, x, x[:, 0], x, torch.zeros(2))
    assert buf.size == 5
    assert sorted(buf.obs.flatten().tolist()) == [0.0, 1.0, 1.0, 2.0, 2.0]


@pytest.mark.slow  # training (600 updates): the full tier's
def test_sac_learns_a_one_step_bandit():
    """Reward −(a − 0.5)²: the actor's mean must move to 0.5 (terminal steps, so Q is the reward)."""
    sac = SAC(1, 1, SACConfig(hidden=32, batch_size=256, init_alpha=0.01, lr=3e-3, buffer_size=4096), seed=0)
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4096, 1, generator=g) * 2 - 1
    sac.add(torch.zeros(4096, 1), a, -((a[:, 0] - 0.5) ** 2), torch.zeros(4096, 1), torch.ones(4096))
    for _ in range(600):
        sac.update()
    with torch.no_grad():
        best = sac.actor(torch.zeros(1, 1), deterministic=True)[0]
    assert abs(float(best) - 0.5) < 0.1


@pytest.mark.slow
def test_sac_solves_pendulum_within_20000_env_steps():
    """Trained until an evaluation reaches -250 (a working SAC gets to -150 to -200 within 20 000 env
    steps), or for all 20 000."""
    pytest.importorskip("gymnasium")
    from redisync.study.pendulum import validate

    result = validate(steps=20_000, until=-250)
    print(
        f"Pendulum-v1: -250 first reached after {result.first_step_reaching(-250)} env steps, best {result.best:.0f}; "
        f"curve (env steps, average return of 10 episodes): {result.curve}"
    )
    assert result.best >= -250, result.curve
    assert result.curve[-1][1] == result.best  # it stopped at the first evaluation that reached -250
