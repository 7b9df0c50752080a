"""The learner checked on a task nobody here wrote: gymnasium's ``Pendulum-v1``.

A working SAC reaches an average return of about −150 to −200 there within 20 000 env steps;
``validate`` trains on a few envs stepped side by side and evaluates the deterministic policy on
fresh episodes along the way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .learner import SAC, SACConfig

MAX_TORQUE = 2.0


@dataclass
class PendulumResult:
    curve: list[tuple[int, float]]  # (env steps, average evaluation return)

    @property
    def best(self) -> float:
        return max(r for _, r in self.curve)

    def first_step_reaching(self, threshold: float) -> int | None:
        return next((s for s, r in self.curve if r >= threshold), None)


def _evaluate(sac: SAC, episodes: int, seed: int) -> float:
    import gymnasium as gym

    returns = []
    env = gym.make("Pendulum-v1")
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                x = sac.normalizer(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
                action = sac.actor(x, deterministic=True)[0][0].numpy()
            obs, reward, terminated, truncated, _ = env.step(MAX_TORQUE * action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def validate(
    steps: int = 20_000,
    num_envs: int = 4,
    seed: int = 0,
    eval_every: int = 2_000,
    eval_episodes: int = 10,
    learning_starts: int = 1_000,
    until: float | None = None,
) -> PendulumResult:
    """Train on ``num_envs`` Pendulum envs for ``steps`` env steps in all, one update per env step;
    with ``until``, stop at the first evaluation whose average return reaches it (a check needs no more)."""
    import gymnasium as gym

    torch.set_num_threads(1)
    sac = SAC(
        3, 1, SACConfig(hidden=256, batch_size=256, tau=0.005, init_alpha=1.0, lr=1e-3, buffer_size=steps), seed=seed
    )
    envs = [gym.make("Pendulum-v1") for _ in range(num_envs)]
    obs = np.stack([e.reset(seed=seed * 100 + i)[0] for i, e in enumerate(envs)])
    rng = np.random.default_rng(seed)
    curve: list[tuple[int, float]] = []
    done_steps = 0
    while done_steps < steps:
        x = torch.tensor(obs, dtype=torch.float32)  # a copy: `obs` is overwritten in place below
        if done_steps < learning_starts:
            action = rng.uniform(-1, 1, size=(num_envs, 1)).astype(np.float32)
        else:
            with torch.no_grad():
                action = sac.actor(sac.normalizer(x))[0].numpy()
        next_obs, rewards, dones = [], [], []
        for i, env in enumerate(envs):
            o, r, terminated, truncated, _ = env.step(MAX_TORQUE * action[i])
            next_obs.append(o)
            rewards.append(r)
            dones.append(terminated)
            if terminated or truncated:
                o, _ = env.reset()
            obs[i] = o
        sac.add(
            x,
            torch.as_tensor(action),
            torch.as_tensor(np.array(rewards), dtype=torch.float32),
            torch.as_tensor(np.stack(next_obs), dtype=torch.float32),
            torch.as_tensor(dones),
        )
        before = done_steps
        done_steps += num_envs
        if done_steps >= learning_starts:
            for _ in range(num_envs):
                sac.update()
        if done_steps // eval_every > before // eval_every:
            curve.append((done_steps, _evaluate(sac, eval_episodes, seed=10_000 + done_steps)))
            if until is not None and curve[-1][1] >= until:
                break
    for env in envs:
        env.close()
    return PendulumResult(curve)
