"""A study configuration small enough for a test of the pipeline (it learns nothing; it runs)."""

from __future__ import annotations

from dataclasses import replace

from redisync.study.fleet import StudyConfig
from redisync.study.learner import SACConfig


def tiny(
    base: StudyConfig, *, env_steps: int, envs_per_shard: int, bins: int, hidden: int, batch_size: int
) -> StudyConfig:
    """``base`` cut down: two shards, learning from half-way, one evaluation at the end, one skill
    segment in a motion of ``bins`` seconds, a replay buffer of twice the run."""
    return replace(
        base,
        shards=2,
        envs_per_shard=envs_per_shard,
        env_steps=env_steps,
        learning_starts=env_steps // 2,
        eval_every=env_steps,
        drift_every=env_steps // 2,
        eval_rollouts=1,
        task=replace(base.task, bins=bins, skill_segments=1),
        sac=SACConfig(hidden=hidden, batch_size=batch_size, buffer_size=2 * env_steps),
    )
