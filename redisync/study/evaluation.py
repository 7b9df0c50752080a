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


LEAD_S = 1.0  # a skill rollout starts this long before its segment


class Evaluation:
    """The deterministic policy's completion from frame 0 and, with ``skill``, its success on each
    skill segment from a start `LEAD_S` before it (the segment's own skill, whatever precedes it)."""

    def __init__(
        self,
        make_env: Callable[[torch.Tensor, int], TrackingEnv],
        profiles: int,
        rollouts: int,
        skill: bool = False,
    ):
        self.profiles = torch.arange(profiles).repeat_interleave(rollouts)
        self.make_env, self.num_profiles, self.rollouts, self.skill = make_env, profiles, rollouts, skill

    def run(self, act_for: Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]) -> dict[str, Any]:
        """One evaluation; ``act_for(profiles)`` is the deterministic policy for a batch of envs of those profiles."""
        act = act_for(self.profiles)
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
        row: dict[str, Any] = {"completion": float(completion.mean()), "completion_by_profile": by_profile.tolist()}
        if self.skill:
            row["skill_success"] = self.skill_success(act_for)
        return row

    def skill_success(self, act_for: Callable[[torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]) -> float:
        """The share of rollouts, `rollouts` per skill segment of each profile, that start `LEAD_S`
        before the segment and reach its end without a failure (nan for a task without skill segments)."""
        probe = self.make_env(torch.arange(self.num_profiles), SEED)
        skill = getattr(probe, "skill_bins", None)
        if skill is None or not bool(skill.any()):
            return float("nan")
        per_bin = probe.num_frames / skill.shape[1]
        lead = round(LEAD_S / probe.step_dt)
        profiles, starts, ends = [], [], []
        for p, b in skill.nonzero().tolist():
            first = int(b * per_bin)
            for _ in range(self.rollouts):
                profiles.append(p)
                starts.append(max(0, first - lead))
                ends.append(min(int((b + 1) * per_bin), probe.num_frames - 1))
        env = self.make_env(torch.tensor(profiles), SEED)
        act = act_for(torch.tensor(profiles))
        n = env.num_envs
        env.reset(torch.arange(n), torch.tensor(starts))
        end = torch.tensor(ends)
        alive = torch.ones(n, dtype=torch.bool)
        reached = torch.zeros(n, dtype=torch.bool)
        with torch.no_grad():
            for _ in range(int((end - torch.tensor(starts)).max())):
                raw = env.observations()
                out = Step(*(t.cpu() for t in env.step(act(raw.cpu()).to(raw.device))))
                alive &= ~out.terminated
                reached |= alive & (env.frames.cpu() >= end)
                if bool((reached | ~alive).all()):
                    break
        return float(reached.float().mean())
