"""One training run: N collector shards feeding one SAC learner, their curriculum synced per arm.

Each shard is a collector as in a distributed trainer — its own envs, its own adaptive sampler and
normaliser, its own store connection and shard client — stepped in lockstep in one process so that a
2-core machine can run the study; the data flow (reports folded in the store, the fleet state pulled
back, one replay buffer, the policy republished every K learner steps) is the distributed one. The
shards sync at fixed points of the step count (`LockstepSync`), not on a worker's wall-clock
timers, so an arm and a seed give the same numbers on a loaded and on an idle machine.

Every shard also publishes a `DriftProbe`: the EMA of its own raw failures and the
distribution it actually samples from, which the learner reads back from the store to measure each
shard's drift from the pooled distribution. Arms share seeds: seed ``s`` gives every arm the same
initial networks, env noise and collector generators (common random numbers), so arms pair by seed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch

from ..collector.seam import SyncedTerm, schema_of
from ..inspection import slot_parts
from ..store.client import Store, connect
from ..store.schema import merge
from ..terms.sampler_options import Mode as SamplerMode
from ..terms.torch.normalization import Mode as NormMode
from ..terms.torch.normalization import SyncedEmpiricalNormalization
from ..terms.torch.sampler import AdaptiveMotionSampler, UniformMix, sampling_probabilities
from .evaluation import Evaluation
from .learner import SAC, Actor, SACConfig
from .task import SkillTracking, Step, TaskConfig, TrackingEnv

EnvFactory = Callable[[torch.Tensor, int], TrackingEnv]
"""``make_env(profiles, seed)``: a batch of ``len(profiles)`` envs; env ``i`` runs profile ``profiles[i]``."""


@dataclass(frozen=True)
class Arm:
    """How a fleet keeps its curriculum: the sampler's sync mode (``uniform``: no adaptive
    sampling; ``per-profile``: pooled per env profile, one group per profile), the uniform mix,
    the normaliser's mode, and the number of shards when it is not the configuration's (the
    fleet's envs stay the same, split among them)."""

    sampler: Literal["uniform", "oracle", "per-profile", "local", "pooled", "weighted", "broadcast"]
    mix: UniformMix = "code"
    normalizer: NormMode = "pooled"
    shards: int | None = None


ARMS: dict[str, Arm] = {
    "uniform": Arm("uniform"),
    # the learnability pilot's: one collector whose starts an oracle puts just before the skill segments
    "oracle": Arm("oracle", shards=1),
    "single": Arm("pooled", shards=1),  # one unsharded collector with every env: the ideal pool
    "pooled": Arm("pooled"),
    "local": Arm("local"),
    "broadcast": Arm("broadcast"),
    "weighted": Arm("weighted"),
    "per-profile": Arm("per-profile"),
    "local-paper": Arm("local", mix="paper"),
    "pooled-paper": Arm("pooled", mix="paper"),
    "local-16-shards": Arm("local", shards=16),
    "pooled-16-shards": Arm("pooled", shards=16),
    "local-paper-16-shards": Arm("local", mix="paper", shards=16),  # the follow-up's mechanism arm
    # the second follow-up's: the mechanism's pooled twin, the semantics at 64 envs per shard, 128 per shard
    "pooled-paper-16-shards": Arm("pooled", mix="paper", shards=16),
    "broadcast-16-shards": Arm("broadcast", shards=16),  # shard 0 owns the state (holosoma's rank 0)
    "weighted-16-shards": Arm("weighted", shards=16),
    "local-8-shards": Arm("local", shards=8),
    "pooled-8-shards": Arm("pooled", shards=8),
    "norm-local": Arm("pooled", normalizer="local"),
}


@dataclass(frozen=True)
class StudyConfig:
    shards: int = 4
    envs_per_shard: int = 256  # 1 024 envs in all: enough failures per step for the code formula to adapt
    env_steps: int = 4_096_000  # across the fleet: 4 000 fleet steps, 8 000 learner updates
    learning_starts: int = 51_200
    updates_per_step: int = 2  # learner updates per fleet step (every shard stepped once)
    republish_every: int = 8  # learner updates between policy republications
    sampler_alpha: float = 0.01  # BeyondMimic's 0.001 is for ~10⁵ steps; the study is shorter
    publish_every_steps: int = 10
    eval_every: int = 512_000
    eval_rollouts: int = 8  # per profile, from frame 0 through the whole motion (one batch: as cheap as 2)
    drift_every: int = 128_000
    skill_eval: bool = False  # evaluate each skill segment from a start 1 s before it too (the fourth study's endpoint)
    task: TaskConfig = field(default_factory=TaskConfig)
    # the replay buffer keeps the whole run: with a FIFO of 200k-1M transitions the adaptive arms forgot a
    # segment once the sampler moved on from it, and the gate failed on that oscillation (docs/ab/pilots.md)
    sac: SACConfig = field(default_factory=lambda: SACConfig(hidden=128, batch_size=512, buffer_size=4_096_000))

    @property
    def total_envs(self) -> int:
        return self.shards * self.envs_per_shard

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StudyConfig:
        d = dict(d)
        return cls(**{**d, "task": TaskConfig(**d["task"]), "sac": SACConfig(**d["sac"])})

    def smoke(self) -> StudyConfig:
        """The CI configuration: a short motion, few steps, the same pipeline."""
        return replace(
            self,
            envs_per_shard=64,
            env_steps=128_000,
            learning_starts=12_800,
            eval_every=16_000,
            drift_every=16_000,
            eval_rollouts=2,
            task=replace(self.task, bins=30, skill_segments=1),
            sac=replace(self.sac, buffer_size=128_000),
        )


def default_env(task: TaskConfig) -> EnvFactory:
    return lambda profiles, seed: SkillTracking(task, profiles, seed)


class DriftProbe:
    """A term that reports, to merge keys of its own, the shard's raw failure EMA (a ``local``
    sampler fed the same failures) and the distribution over bins the shard's envs start from."""

    OWN, USED = "ab/own_failures", "ab/used_probs"

    def __init__(self, bins: int, num_frames: int, step_dt: float, alpha: float, uniform_ratio: float):
        self.witness = AdaptiveMotionSampler(
            num_frames, step_dt, mode="local", alpha=alpha, uniform_ratio=uniform_ratio
        )
        self.used = np.full(bins, 1.0 / bins)  # a uniform arm's; a sampling shard sets what it samples from

    def record_failures(self, frames: torch.Tensor, failed: torch.Tensor) -> None:
        self.witness.record_failures(frames, failed)

    def step(self) -> None:
        self.witness.step()

    def schema_entries(self) -> Mapping[str, Any]:
        n = self.witness.bin_count
        return {self.OWN: merge(n, lifecycle="history"), self.USED: merge(n, lifecycle="history")}

    def report_shard_state(self) -> Mapping[str, Mapping[str, Any]]:
        own = self.witness.bin_failed_count.double().numpy().copy()
        return {self.OWN: {"count": 1.0, "sum": own}, self.USED: {"count": 1.0, "sum": self.used.copy()}}

    def apply_shard_state(self, fleet: Any) -> None:
        """Nothing to apply: the probe only reports."""


def fleet_drift(store: Store, uniform_ratio: float, mix: UniformMix = "code") -> dict[str, Any]:
    """``tv``: per shard (by id), the TV distance between the distribution it samples from and the
    pooled one (the pooled EMA under the arm's own uniform mix, so that an arm with the paper's mix
    is not called drifted for its mix); ``buffer_tv``: the same for the mixture of the shards'
    distributions — what the replay buffer receives, since every shard feeds it equally."""
    own_agg, _ = slot_parts(store, DriftProbe.OWN)
    _, used = slot_parts(store, DriftProbe.USED)
    if own_agg is None or not used:
        return {"tv": [], "buffer_tv": None}
    pooled = sampling_probabilities(
        torch.as_tensor(own_agg["sum"]), uniform_ratio, torch.ones(1, dtype=torch.float64), mix
    ).numpy()
    dists = [used[s]["sum"] / used[s]["sum"].sum() for s in sorted(used)]
    tv = [0.5 * float(np.abs(d - pooled).sum()) for d in dists]
    return {"tv": tv, "buffer_tv": 0.5 * float(np.abs(np.mean(dists, 0) - pooled).sum())}


class LockstepSync:
    """One shard's sync in the study: its report published, then the fleet state pulled and handed
    to its terms, when the run says so (every ``publish_every_steps`` fleet steps, every shard in
    shard order), so that what each shard sees at each step depends on the seed alone. A trainer's
    collectors use a `Syncer`, which never waits; this one waits,
    which a study may, for the sake of reproducible runs."""

    def __init__(self, store: Store, shard: int, terms: list[SyncedTerm]):
        store.register(schema_of(terms))
        self.client, self.terms = store.shard(shard), terms

    def publish(self) -> None:
        reports: dict[str, Any] = {}
        for term in self.terms:
            reports.update(term.report_shard_state())
        if reports:
            self.client.publish(reports)

    def apply(self) -> None:
        if self.client.pull() is not None and self.client.known is not None:
            for term in self.terms:
                term.apply_shard_state(self.client.known)


def sync_round(collectors: list[Collector]) -> None:
    """Every shard publishes (in shard order), then every shard takes the fleet state."""
    for c in collectors:
        c.sync.publish()
    for c in collectors:
        c.sync.apply()


@dataclass
class Collector:
    """One shard: its envs, terms and syncer, acting with the last republished policy."""

    env: TrackingEnv
    sampler: AdaptiveMotionSampler
    normalizer: SyncedEmpiricalNormalization
    probe: DriftProbe
    sync: LockstepSync
    generator: torch.Generator
    profiles: torch.Tensor
    arm: Arm
    env_steps: int = 0
    skill_steps: int = 0

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
        skill = getattr(env, "skill_bins", None)
        if skill is not None:  # the mechanism: how much of the fleet's experience lies in skill segments
            frames = env.frames.cpu()
            self.skill_steps += int(skill[self.profiles, frames * skill.shape[1] // env.num_frames].sum())
        self.env_steps += env.num_envs
        out = Step(*(t.cpu() for t in env.step(action.to(raw.device))))
        learner.add(obs, action, out.reward, out.obs, out.terminated)
        done = out.terminated | out.truncated
        frames = env.frames.cpu()
        groups = self.profiles[done] if self.sampler.grouped else None
        self.sampler.record_failures(frames[done], out.terminated[done], groups)
        self.sampler.step()
        self.probe.record_failures(frames[done], out.terminated[done])
        self.probe.step()
        if bool(done.any()):
            ids = done.nonzero().squeeze(1)
            env.reset(ids, self.starts(ids))

    def starts(self, ids: torch.Tensor) -> torch.Tensor:
        n = len(ids)
        if self.arm.sampler == "oracle":
            return self.oracle_starts(n)
        if self.arm.sampler == "uniform":
            bins = torch.randint(0, self.sampler.bin_counts[0], (n,), generator=self.generator)
            offset = torch.rand(n, generator=self.generator)
            return ((bins + offset) / self.sampler.bin_counts[0] * (self.env.num_frames - 1)).long()
        groups = self.profiles[ids] if self.sampler.grouped else None
        probs = self.sampler.probabilities()
        self.probe.used = (probs[int(self.profiles[0])] if self.sampler.grouped else probs).double().numpy().copy()
        return self.sampler.sample(n, groups, generator=self.generator)

    ORACLE_SHARE = 0.75  # of an oracle's starts, the share just before a skill segment (the rest uniform)

    def oracle_starts(self, n: int) -> torch.Tensor:
        """Starts an oracle that knows where the skill segments lie would choose: `ORACLE_SHARE` of
        them in the second before a segment of the env's profile, the rest uniform over the motion."""
        env, g = self.env, self.generator
        skill = getattr(env, "skill_bins", None)
        last = env.num_frames - 1
        uniform = (torch.rand(n, generator=g) * last).long()
        if skill is None:
            return uniform
        per_bin = env.num_frames / skill.shape[1]
        segments = skill[int(self.profiles[0])].nonzero().squeeze(1)
        if len(segments) == 0:
            return uniform
        pick = segments[torch.randint(0, len(segments), (n,), generator=g)].double()
        lead = torch.rand(n, generator=g, dtype=torch.float64) * (1.0 / env.step_dt)
        before = (pick * per_bin - lead).clamp(min=0).long()
        near = torch.rand(n, generator=g) < self.ORACLE_SHARE
        return torch.where(near, before, uniform)


def make_collector(
    cfg: StudyConfig,
    arm: Arm,
    shard: int,
    shards: int,
    per_shard: int,
    seed: int,
    url: str | None,
    run: str,
    make_env: EnvFactory,
) -> Collector:
    """A shard of the arm's fleet. In X, shard ``s`` runs profile ``s mod P`` (one unsharded
    collector runs every profile); in H there is one profile."""
    profiles_n = cfg.task.num_profiles
    ids = torch.arange(per_shard) + shard * per_shard
    profiles = ids % profiles_n if shards == 1 else torch.full((per_shard,), shard % profiles_n)
    env = make_env(profiles, seed * 1_000 + shard)
    grouped = arm.sampler == "per-profile"
    mode: SamplerMode = (
        "local"
        if arm.sampler == "uniform" or arm.sampler == "oracle"
        else "pooled"
        if arm.sampler == "per-profile"
        else arm.sampler
    )
    frames = [env.num_frames] * profiles_n if grouped else env.num_frames
    sampler = AdaptiveMotionSampler(
        frames,
        env.step_dt,
        mode=mode,
        shard_id=shard,
        alpha=cfg.sampler_alpha,
        uniform_mix=arm.mix,
        fleet_shards=shards,
    )
    normalizer = SyncedEmpiricalNormalization(env.obs_dim, mode=arm.normalizer)
    probe = DriftProbe(
        env.num_frames // int(1 / env.step_dt) + 1,
        env.num_frames,
        env.step_dt,
        cfg.sampler_alpha,
        sampler.uniform_ratio,
    )
    sync = LockstepSync(connect(url, run=run), shard, [sampler, normalizer, probe])
    collector = Collector(
        env,
        sampler,
        normalizer,
        probe,
        sync,
        torch.Generator().manual_seed(seed * 1_000 + 500 + shard),
        profiles,
        arm,
    )
    env.reset(torch.arange(env.num_envs), collector.starts(torch.arange(env.num_envs)))
    return collector


def as_collectors_act(
    actor: Actor, collectors: list[Collector], profiles: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The deterministic policy as the fleet runs it: each profile's observations normalised by the
    normaliser of the first shard that runs that profile (so a ``norm-local`` arm is evaluated with
    the statistics its collectors act on, not with the learner's, which see all the data)."""
    owner: dict[int, Collector] = {}
    for c in collectors:
        for p in c.profiles.unique().tolist():
            owner.setdefault(int(p), c)
    masks = [(profiles == p, c) for p, c in sorted(owner.items())]

    def act(obs: torch.Tensor) -> torch.Tensor:
        out = torch.empty(obs.shape[0], collectors[0].env.act_dim)
        for mask, c in masks:
            out[mask] = actor(c.normalizer(obs[mask]), deterministic=True)[0]
        return out

    return act


def run_arm(
    cfg: StudyConfig,
    arm_name: str,
    seed: int,
    url: str | None = None,
    make_env: EnvFactory | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Train one arm with one seed: the completion curve, drift over time and timings."""
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    make_env = make_env or default_env(cfg.task)
    arm = ARMS[arm_name]
    shards = arm.shards or cfg.shards
    per_shard = cfg.total_envs // shards
    run = f"ab-{cfg.task.condition}-{arm_name}-s{seed}-{uuid.uuid4().hex[:8]}"
    collectors = [make_collector(cfg, arm, s, shards, per_shard, seed, url, run, make_env) for s in range(shards)]
    first = collectors[0].env
    learner = SAC(first.obs_dim, first.act_dim, cfg.sac, seed=seed)
    monitor = connect(url, run=run)
    evaluation = Evaluation(make_env, cfg.task.num_profiles, cfg.eval_rollouts, skill=cfg.skill_eval)
    curve: list[dict[str, Any]] = []
    drift: list[dict[str, Any]] = []
    policy: Actor | None = None
    timing = {"collect_s": 0.0, "learn_s": 0.0, "eval_s": 0.0}
    fleet_envs = shards * per_shard
    env_steps, fleet_steps, t_start = 0, 0, time.perf_counter()
    try:
        while env_steps < cfg.env_steps:
            t = time.perf_counter()
            for c in collectors:
                c.step(policy, learner)
            fleet_steps += 1
            if fleet_steps % cfg.publish_every_steps == 0:
                sync_round(collectors)
            timing["collect_s"] += time.perf_counter() - t
            before, env_steps = env_steps, env_steps + fleet_envs
            if env_steps >= cfg.learning_starts:
                t = time.perf_counter()
                for _ in range(cfg.updates_per_step):
                    learner.update()
                    if learner.updates % cfg.republish_every == 0 or policy is None:
                        policy = learner.policy_copy()
                timing["learn_s"] += time.perf_counter() - t
            if env_steps // cfg.drift_every > before // cfg.drift_every:
                drift.append(
                    {
                        "env_steps": env_steps,
                        **fleet_drift(monitor, collectors[0].sampler.uniform_ratio, arm.mix),
                        # each shard's own EMA and the fleet's pooled one, as the sampler's warning judges
                        # them (redisync.terms.formulas.EmaWatch)
                        "ema": [c.sampler.ema_statistics() for c in collectors],
                        "ema_fleet": collectors[0].sampler.ema_statistics(pooled_with=[c.sampler for c in collectors]),
                    }
                )
            if env_steps // cfg.eval_every > before // cfg.eval_every or env_steps >= cfg.env_steps:
                t = time.perf_counter()
                row = evaluation.run(lambda profiles: as_collectors_act(learner.actor, collectors, profiles))
                curve.append({"env_steps": env_steps, **row})
                timing["eval_s"] += time.perf_counter() - t
            if on_progress is not None:
                on_progress(env_steps - before)
    finally:
        wall = time.perf_counter() - t_start
        monitor.delete()
    return {
        "arm": arm_name,
        "condition": cfg.task.condition,
        "seed": seed,
        "shards": shards,
        "curve": curve,
        "drift": drift,
        "skill_share": sum(c.skill_steps for c in collectors) / max(sum(c.env_steps for c in collectors), 1),
        "wall_s": wall,
        **timing,
    }
