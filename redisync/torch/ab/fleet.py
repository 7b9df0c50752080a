"""One training run of the study: N collector shards feeding one SAC learner, synced per arm.

Each shard is a collector as in a distributed trainer — its own envs, its own adaptive sampler and
normaliser, its own store connection and :class:`~redisync.syncer.Syncer` — stepped in lockstep in
one process so that a 2-core machine can run the study; the data flow (reports, pulls at reset
boundaries, one replay buffer, the policy republished every K learner steps) is the distributed one.

Every arm's shards also publish a :class:`DriftProbe`: the EMA of their own raw failures and the
distribution they actually sample from. The learner reads both back from the store, as a user
would watch a fleet, and measures each shard's drift from the pooled distribution.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping
import uuid

import numpy as np
import torch

from ...client import Store, connect
from ...inspection import slot_parts
from ...schema import merge
from ...syncer import Syncer
from ..normalization import SyncedEmpiricalNormalization
from ..sampler import AdaptiveMotionSampler, sampling_probabilities
from .sac import SAC, Actor, SACConfig
from .task import PointMassTracking, Step, TaskConfig, TrackingEnv

EnvFactory = Callable[[torch.Tensor, int], TrackingEnv]
"""``make_env(profiles, seed)``: a batch of ``len(profiles)`` envs; env ``i`` perturbed as profile ``profiles[i]``."""

ARMS: dict[str, tuple[str, str]] = {
    # arm: (sampler mode, normaliser mode); "single" is one unsharded collector with every env
    "single": ("pooled", "pooled"),
    "local": ("local", "pooled"),
    "pooled": ("pooled", "pooled"),
    "weighted": ("weighted", "pooled"),
    "broadcast": ("broadcast", "pooled"),
    "local+norm-local": ("local", "local"),
    "pooled+norm-local": ("pooled", "local"),
    # the control: no adaptive sampling at all, start frames uniform (does the curriculum matter here?)
    "uniform": ("uniform", "pooled"),
}


@dataclass(frozen=True)
class StudyConfig:
    shards: int = 4
    envs_per_shard: int = 16
    env_steps: int = 48_000  # across the fleet: every arm has learnt the task by ~25k
    learning_starts: int = 4_000
    updates_per_step: int = 2  # learner updates per fleet step (every shard stepped once)
    republish_every: int = 8  # learner updates between policy republications
    sampler_alpha: float = 0.01  # BeyondMimic's 0.001 is for ~10⁵ steps; the study is shorter
    publish_every_steps: int = 10
    eval_every: int = 3_000
    eval_starts_per_bin: int = 4  # per profile
    eval_horizon: int = 50  # one bin: a start's survival is about its own bin
    drift_every: int = 1_000
    survival_threshold: float = 0.7
    task: TaskConfig = field(default_factory=TaskConfig)
    sac: SACConfig = field(default_factory=lambda: SACConfig(hidden=128, batch_size=1024))

    @property
    def total_envs(self) -> int:
        return self.shards * self.envs_per_shard

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StudyConfig":
        d = dict(d)
        return cls(**{**d, "task": TaskConfig(**d["task"]), "sac": SACConfig(**d["sac"])})

    def smoke(self) -> "StudyConfig":
        """The CI configuration: few envs and steps, the same pipeline."""
        return replace(self, shards=2, envs_per_shard=16, env_steps=24_000, learning_starts=2_000, eval_every=6_000,
                       eval_starts_per_bin=2, drift_every=1_000, task=replace(self.task, bins=10, profiles=2))


def default_env(task: TaskConfig) -> EnvFactory:
    return lambda profiles, seed: PointMassTracking(task, profiles, seed)


class DriftProbe:
    """A term that reports, to merge keys of its own, the shard's raw failure EMA (a ``local``
    sampler fed the same failures) and the distribution the shard's sampler samples from."""

    OWN, USED = "ab/own_failures", "ab/used_probs"

    def __init__(self, sampler: AdaptiveMotionSampler, step_dt: float, uniform: bool = False):
        self.sampler, self.uniform = sampler, uniform
        self.witness = AdaptiveMotionSampler(sampler.num_frames, step_dt, mode="local", alpha=sampler.alpha,
                                             uniform_ratio=sampler.uniform_ratio)

    def record_failures(self, frames: torch.Tensor, failed: torch.Tensor) -> None:
        self.witness.record_failures(frames, failed)

    def step(self) -> None:
        self.witness.step()

    def schema_entries(self) -> Mapping[str, Any]:
        n = self.sampler.bin_count
        return {self.OWN: merge(n), self.USED: merge(n)}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        own = self.witness.bin_failed_count.double().numpy().copy()
        n = self.sampler.bin_count
        used = np.full(n, 1.0 / n) if self.uniform else self.sampler.probabilities().double().numpy().copy()
        return {self.OWN: {"count": 1.0, "sum": own}, self.USED: {"count": 1.0, "sum": used}}

    def apply_shard_state(self, fleet: Any) -> None:
        """Nothing to apply: the probe only reports."""


def fleet_drift(store: Store, uniform_ratio: float) -> dict[str, Any]:
    """``tv``: per shard (by id), the TV distance between the distribution it samples from and the
    pooled one; ``buffer_tv``: the same for the mixture of the shards' distributions — what the
    replay buffer receives, since every shard feeds it equally."""
    own_agg, _ = slot_parts(store, DriftProbe.OWN)
    _, used = slot_parts(store, DriftProbe.USED)
    if own_agg is None or not used:
        return {"tv": [], "buffer_tv": None}
    pooled = sampling_probabilities(torch.as_tensor(own_agg["sum"]), uniform_ratio, torch.ones(1, dtype=torch.float64)).numpy()
    dists = [used[s]["sum"] / used[s]["sum"].sum() for s in sorted(used)]
    tv = [0.5 * float(np.abs(d - pooled).sum()) for d in dists]
    return {"tv": tv, "buffer_tv": 0.5 * float(np.abs(np.mean(dists, 0) - pooled).sum())}


@dataclass
class Collector:
    """One shard: its envs, terms and syncer, acting with the last republished policy."""

    env: TrackingEnv
    sampler: AdaptiveMotionSampler
    normalizer: SyncedEmpiricalNormalization
    probe: DriftProbe
    syncer: Syncer
    generator: torch.Generator
    uniform_starts: bool = False
    sync_s: float = 0.0
    episode_return: torch.Tensor | None = None
    finished_returns: list[float] = field(default_factory=list)

    def step(self, policy: Actor | None, learner: SAC) -> None:
        env = self.env
        raw = env.observations()
        obs = raw.cpu()  # the learner and the terms live on the CPU; the env may not
        self.normalizer.update(obs)
        with torch.no_grad():
            if policy is None:
                action = torch.rand(env.num_envs, env.act_dim, generator=self.generator) * 2 - 1
            else:
                action = policy(self.normalizer(obs))[0]
        out = Step(*(t.cpu() for t in env.step(action.to(raw.device))))
        learner.add(obs, action, out.reward, out.obs, out.terminated)
        self.episode_return = out.reward if self.episode_return is None else self.episode_return + out.reward
        done = out.terminated | out.truncated
        frames = env.frames.cpu()
        for term in (self.sampler, self.probe):
            term.record_failures(frames[done], out.terminated[done])
            term.step()
        t = time.perf_counter()
        self.syncer.on_step()
        if bool(done.any()):
            self.syncer.at_reset_boundary()
            self.sync_s += time.perf_counter() - t
            ids = done.nonzero().squeeze(1)
            self.finished_returns.extend(self.episode_return[ids].tolist())
            self.episode_return[ids] = 0
            env.reset(ids, self.starts(len(ids)))
        else:
            self.sync_s += time.perf_counter() - t


    def starts(self, n: int) -> torch.Tensor:
        if self.uniform_starts:
            return torch.randint(0, self.env.num_frames, (n,), generator=self.generator)
        return self.sampler.sample(n, generator=self.generator)


class Evaluation:
    """A fixed evaluation set: every bin × profile, ``starts`` start frames spread uniformly inside
    the bin, the same for every arm and seed; the deterministic policy runs ``horizon`` steps."""

    def __init__(self, cfg: StudyConfig, make_env: EnvFactory):
        bins, profiles, k = cfg.task.bins, cfg.task.profiles, cfg.eval_starts_per_bin
        grid = torch.stack(torch.meshgrid(torch.arange(bins), torch.arange(profiles), torch.arange(k), indexing="ij"), -1).view(-1, 3)
        self.bins, self.horizon, self.num_bins = grid[:, 0], cfg.eval_horizon, bins
        self.env = make_env(grid[:, 1], 7_777)
        frames = self.env.num_frames
        self.starts = (((grid[:, 0] + (grid[:, 2] + 0.5) / k) / bins) * (frames - 1)).long()

    def run(self, act: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, Any]:
        env = self.env
        env.reset(torch.arange(env.num_envs), self.starts)
        alive = torch.ones(env.num_envs, dtype=torch.bool)
        fell = torch.zeros(env.num_envs, dtype=torch.bool)
        ret = torch.zeros(env.num_envs)
        with torch.no_grad():
            for _ in range(self.horizon):
                raw = env.observations()
                out = Step(*(t.cpu() for t in env.step(act(raw.cpu()).to(raw.device))))
                ret += out.reward * alive
                fell |= out.terminated & alive
                alive &= ~(out.terminated | out.truncated)
                if not bool(alive.any()):
                    break
        survived = (~fell).float()
        per_bin = torch.zeros(self.num_bins).index_add_(0, self.bins, survived) / torch.bincount(self.bins, minlength=self.num_bins)
        return {"return": float(ret.mean()), "survival": per_bin.tolist()}


def random_policy(num_actions: int, seed: int) -> Callable[[torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return lambda obs: torch.rand(obs.shape[0], num_actions, generator=g) * 2 - 1


def run_arm(cfg: StudyConfig, arm: str, seed: int, url: str | None = None,
            make_env: EnvFactory | None = None, on_progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Train one arm with one seed; the learning curve, drift over time and timings."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    make_env = make_env or default_env(cfg.task)
    sampler_mode, norm_mode = ARMS[arm]
    n_shards = 1 if arm == "single" else cfg.shards
    per_shard = cfg.total_envs // n_shards
    run = f"ab-{arm.replace('+', '.')}-s{seed}-{uuid.uuid4().hex[:8]}"
    collectors = []
    for s in range(n_shards):
        ids = torch.arange(per_shard) + s * per_shard
        profiles = ids % cfg.task.profiles if n_shards == 1 else torch.full((per_shard,), s % cfg.task.profiles)
        env = make_env(profiles, seed * 1_000 + s)
        uniform = sampler_mode == "uniform"
        sampler = AdaptiveMotionSampler(env.num_frames, env.step_dt, mode="local" if uniform else sampler_mode, shard_id=s,
                                        alpha=cfg.sampler_alpha)
        normalizer = SyncedEmpiricalNormalization(env.obs_dim, mode=norm_mode)
        probe = DriftProbe(sampler, env.step_dt, uniform)
        syncer = Syncer(connect(url, run=run), s, [sampler, normalizer, probe], publish_every_steps=cfg.publish_every_steps,
                        publish_every_s=0.5, poll_every_s=0.5, min_pull_interval_s=0.02).start()
        collector = Collector(env, sampler, normalizer, probe, syncer, torch.Generator().manual_seed(seed * 1_000 + 500 + s), uniform)
        env.reset(torch.arange(env.num_envs), collector.starts(env.num_envs))
        collectors.append(collector)
    first = collectors[0].env
    learner = SAC(first.obs_dim, first.act_dim, cfg.sac, seed=seed)
    monitor = connect(url, run=run)
    evaluation = Evaluation(cfg, make_env)
    curve: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    policy: Actor | None = None
    timing = {"collect_s": 0.0, "learn_s": 0.0, "eval_s": 0.0}
    env_steps, t_start = 0, time.perf_counter()
    try:
        while env_steps < cfg.env_steps:
            t = time.perf_counter()
            for c in collectors:
                c.step(policy, learner)
            timing["collect_s"] += time.perf_counter() - t
            before, env_steps = env_steps, env_steps + cfg.total_envs
            if env_steps >= cfg.learning_starts:
                t = time.perf_counter()
                for _ in range(cfg.updates_per_step):
                    learner.update()
                    if learner.updates % cfg.republish_every == 0 or policy is None:
                        policy = learner.policy_copy()
                timing["learn_s"] += time.perf_counter() - t
            if env_steps // cfg.drift_every > before // cfg.drift_every:
                drift.append({"env_steps": env_steps, **fleet_drift(monitor, collectors[0].sampler.uniform_ratio)})
            if env_steps // cfg.eval_every > before // cfg.eval_every or env_steps >= cfg.env_steps:
                t = time.perf_counter()
                actor = learner.actor
                row = evaluation.run(lambda obs: actor(learner.normalizer(obs), deterministic=True)[0])
                curve.append({"env_steps": env_steps, **row})
                timing["eval_s"] += time.perf_counter() - t
            if on_progress is not None:
                on_progress(env_steps - before)
    finally:
        for c in collectors:
            c.syncer.stop()
        wall = time.perf_counter() - t_start
        metrics = [c.syncer.metrics() for c in collectors]
        monitor.delete()
    returns = [r for c in collectors for r in c.finished_returns]
    return {
        "arm": arm, "seed": seed, "shards": n_shards, "curve": curve, "drift": drift,
        "train_episode_return": float(np.mean(returns[-200:])) if returns else 0.0,
        "wall_s": wall, **timing,
        "sync_s": sum(c.sync_s for c in collectors),
        "publishes": sum(m.get("redisync/publishes", 0) for m in metrics),
        "publish_latency_ms_p50": float(np.median([m["redisync/publish_latency_ms_p50"] for m in metrics
                                                   if "redisync/publish_latency_ms_p50" in m] or [0.0])),
        "final_sampling_entropy": float(np.mean([c.sampler.metrics()["sampling_entropy"] for c in collectors])),
    }
