"""The primary measurement: how much of the whole motion the deterministic policy tracks.

BeyondMimic's criterion: a policy has learnt a motion when it tracks all of it. From frame 0, a few
rollouts per env profile run the deterministic policy through the whole motion; a rollout's
completion is the share of the motion it tracked before its first fall (1.0: all of it). The same
rollouts (profiles, initial noise) for every arm and seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .task import Step, TrackingEnv

SEED = 7_777


class Evaluation:
    def __init__(self, make_env: Callable[[torch.Tensor, int], TrackingEnv], profiles: int, rollouts: int):
        self.profiles = torch.arange(profiles).repeat_interleave(rollouts)
        self.make_env, self.num_profiles = make_env, profiles

    def run(self, act: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        env = self.make_env(self.profiles, SEED)  # a fresh batch: the same initial noise every time
        n, last = env.num_envs, env.num_frames - 1
        env.reset(torch.arange(n), torch.zeros(n, dtype=torch.long))
        tracked = torch.full((n,), float(last))
        alive = torch.ones(n, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(last):
                raw = env.observations()
                out = Step(*(t.cpu() for t in env.step(act(raw.cpu()).to(raw.device))))
                fell = out.terminated & alive
                tracked[fell] = env.frames.cpu()[fell].float() - 1
                alive &= ~out.terminated
                if not bool(alive.any()):
                    break
        completion = tracked / last
        by_profile = torch.zeros(self.num_profiles).index_add_(0, self.profiles, completion) / torch.bincount(
            self.profiles
        )
        return {"completion": float(completion.mean()), "completion_by_profile": by_profile.tolist()}
