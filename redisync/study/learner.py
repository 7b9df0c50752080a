"""A compact FastSAC-style learner, sized for a 2-core CPU.

Twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian actor, automatic entropy
tuning, large batches drawn from one replay buffer that every collector shard feeds, and
observation normalisation by a `SyncedEmpiricalNormalization` that learns from every
transition entering the buffer (the learner sees the whole fleet's data). Collectors act with a
copy of the actor republished every few learner steps, and normalise with normalisers of their
own — which is where unsynced normalisation statistics would part from the learner's.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..terms.torch.normalization import SyncedEmpiricalNormalization

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass(frozen=True)
class SACConfig:
    hidden: int = 256
    batch_size: int = 1024
    gamma: float = 0.99
    tau: float = 0.01
    lr: float = 3e-4
    init_alpha: float = 0.1
    target_entropy_per_dim: float = -1.0
    buffer_size: int = 200_000


def mlp(inp: int, out: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)
    )


class Actor(nn.Module):
    """A tanh-Gaussian policy on normalised observations; actions lie in [-1, 1]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim, hidden)

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mu, log_std = self.net(obs).chunk(2, dim=-1)
        if deterministic:
            return torch.tanh(mu), torch.zeros(obs.shape[0])
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        action = torch.tanh(u)
        # log N(u; mu, std) minus the tanh Jacobian, in its numerically stable form
        log_prob = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
        return action, log_prob


class TwinQ(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.q1, self.q2 = mlp(obs_dim + act_dim, 1, hidden), mlp(obs_dim + act_dim, 1, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class ReplayBuffer:
    """A ring buffer of raw transitions; ``done`` is a fall only (a time-out still bootstraps)."""

    def __init__(self, capacity: int, obs_dim: int, act_dim: int, generator: torch.Generator | None = None):
        self.capacity, self.size, self.next = capacity, 0, 0
        self.obs = torch.zeros(capacity, obs_dim)
        self.act = torch.zeros(capacity, act_dim)
        self.rew = torch.zeros(capacity)
        self.next_obs = torch.zeros(capacity, obs_dim)
        self.done = torch.zeros(capacity)
        self.generator = generator

    def add(
        self, obs: torch.Tensor, act: torch.Tensor, rew: torch.Tensor, next_obs: torch.Tensor, done: torch.Tensor
    ) -> None:
        idx = (self.next + torch.arange(obs.shape[0])) % self.capacity
        self.obs[idx], self.act[idx], self.rew[idx] = obs, act, rew
        self.next_obs[idx], self.done[idx] = next_obs, done.float()
        self.next = int(idx[-1] + 1) % self.capacity
        self.size = min(self.size + obs.shape[0], self.capacity)

    def sample(self, n: int) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(0, self.size, (n,), generator=self.generator)
        return self.obs[idx], self.act[idx], self.rew[idx], self.next_obs[idx], self.done[idx]


class SAC:
    def __init__(self, obs_dim: int, act_dim: int, cfg: SACConfig = SACConfig(), seed: int = 0):
        torch.manual_seed(seed)
        self.cfg = cfg
        self.actor = Actor(obs_dim, act_dim, cfg.hidden)
        self.critic = TwinQ(obs_dim, act_dim, cfg.hidden)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = torch.tensor(math.log(cfg.init_alpha), requires_grad=True)
        self.target_entropy = cfg.target_entropy_per_dim * act_dim
        # foreach: one fused step over all parameters (on the CPU, Adam otherwise loops tensor by tensor)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=cfg.lr, foreach=True)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=cfg.lr, foreach=True)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.normalizer = SyncedEmpiricalNormalization(obs_dim, mode="local")
        self.buffer = ReplayBuffer(cfg.buffer_size, obs_dim, act_dim, torch.Generator().manual_seed(seed))
        self.updates = 0

    def add(
        self, obs: torch.Tensor, act: torch.Tensor, rew: torch.Tensor, next_obs: torch.Tensor, done: torch.Tensor
    ) -> None:
        self.normalizer.update(obs)
        self.buffer.add(obs, act, rew, next_obs, done)

    def policy_copy(self) -> Actor:
        """A frozen copy of the actor for a collector (the republished policy)."""
        return copy.deepcopy(self.actor).requires_grad_(False)

    def update(self) -> dict[str, float]:
        obs, act, rew, next_obs, done = self.buffer.sample(self.cfg.batch_size)
        obs, next_obs = self.normalizer(obs), self.normalizer(next_obs)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_act, next_logp = self.actor(next_obs)
            q1_t, q2_t = self.critic_target(next_obs, next_act)
            target = rew + self.cfg.gamma * (1 - done) * (torch.min(q1_t, q2_t) - alpha * next_logp)
        q1, q2 = self.critic(obs, act)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        new_act, logp = self.actor(obs)
        self.critic.requires_grad_(False)
        q_new = torch.min(*self.critic(obs, new_act))
        self.critic.requires_grad_(True)
        actor_loss = (alpha * logp - q_new).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        with torch.no_grad():
            torch._foreach_lerp_(list(self.critic_target.parameters()), list(self.critic.parameters()), self.cfg.tau)
        self.updates += 1
        return {"critic_loss": critic_loss.item(), "actor_loss": actor_loss.item(), "alpha": alpha.item()}
