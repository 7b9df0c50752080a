"""The A/B study: its task, learner, statistics and the whole pipeline at smoke size."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from redisync.torch.ab.fleet import ARMS, StudyConfig, run_arm
from redisync.torch.ab.sac import SAC, ReplayBuffer, SACConfig
from redisync.torch.ab.stats import diff_ci, mean_ci
from redisync.torch.ab.study import load_env_factory
from redisync.torch.ab.task import PointMassTracking, Step, TaskConfig, TrackingEnv

from .conftest import real_redis_or_skip


# ---------------------------------------------------------------- statistics


def test_mean_interval_covers_the_mean_and_narrows_with_more_seeds():
    rng = np.random.default_rng(1)
    few, many = mean_ci(rng.normal(3, 1, 5)), mean_ci(rng.normal(3, 1, 200))
    assert few.lo < few.mean < few.hi and many.lo < 3 < many.hi
    assert many.hi - many.lo < (few.hi - few.lo) / 3


def test_difference_interval_excludes_zero_only_for_a_real_difference():
    rng = np.random.default_rng(2)
    a, b, c = rng.normal(0, 1, 8), rng.normal(0, 1, 8), rng.normal(5, 1, 8)
    assert not diff_ci(a, b).excludes_zero()
    d = diff_ci(c, a)
    assert d.excludes_zero() and d.lo > 2 and math.isclose(d.mean, c.mean() - a.mean())


def test_a_bootstrap_of_nothing_or_of_nan_is_refused():
    with pytest.raises(ValueError, match="non-empty"):
        mean_ci([])
    with pytest.raises(ValueError, match="finite"):
        diff_ci([1.0, float("nan")], [1.0])


# ---------------------------------------------------------------- the task


def test_the_task_steps_every_env_in_one_batch_and_ends_an_episode_on_a_fall():
    cfg = TaskConfig(bins=6, profiles=2)
    env = PointMassTracking(cfg, torch.tensor([0, 1, 0, 1]), seed=0)
    assert isinstance(env, TrackingEnv) and env.num_frames == 6 * 50 - 1
    env.reset(torch.arange(4), torch.tensor([0, 60, 120, 200]))
    assert torch.equal(env.frames, torch.tensor([0, 60, 120, 200]))
    env.pos[2] += 1.0  # far off the reference: a fall
    out = env.step(torch.zeros(4, 2))
    assert isinstance(out, Step) and out.obs.shape == (4, env.obs_dim)
    assert out.terminated.tolist() == [False, False, True, False]
    err = (env.ref_pos[env.frames] - env.pos).norm(dim=1)
    assert torch.allclose(out.reward, torch.exp(-(err / cfg.sigma) ** 2))
    assert torch.equal(env.frames, torch.tensor([1, 61, 121, 201]))


def test_a_timeout_or_the_end_of_the_motion_truncates_without_a_fall():
    env = PointMassTracking(TaskConfig(bins=4, profiles=1, push_prob=0.0), torch.zeros(2, dtype=torch.long))
    env.reset(torch.arange(2), torch.tensor([0, env.num_frames - 2]))
    ref_acc = (env.ref_vel[1] - env.ref_vel[0]) * 50
    out = env.step((ref_acc + env.cfg.damping * env.ref_vel[0]).div(env.cfg.max_force).expand(2, 2))
    assert out.truncated.tolist() == [False, True] and not out.terminated.any()


def test_heterogeneity_moves_pushes_from_shared_bins_to_each_profiles_own():
    _, shared = TaskConfig(profiles=3, heterogeneity=0.0).layout()
    _, own = TaskConfig(profiles=3, heterogeneity=1.0).layout()
    assert torch.equal(shared[0], shared[1]) and torch.equal(shared[1], shared[2])
    assert not torch.equal(own[0], own[1]) or not torch.equal(own[1], own[2])
    assert float(shared.sum()) == pytest.approx(float(own.sum()))  # the same amount of pushing


def test_the_reference_is_smooth_and_fast_in_the_hard_bins():
    cfg = TaskConfig()
    env = PointMassTracking(cfg, torch.zeros(1, dtype=torch.long))
    step = (env.ref_pos[1:] - env.ref_pos[:-1]).norm(dim=1)
    assert float(step.max()) < 0.1  # no jumps: at most a few cm per frame
    speed = env.ref_vel.norm(dim=1).view(-1)[: cfg.bins * 50 - 50].view(cfg.bins - 1, 50).mean(1)
    hard = env.hard_bins[: cfg.bins - 1]
    assert float(speed[hard].mean()) > 1.5 * float(speed[~hard].mean())


# ---------------------------------------------------------------- the learner


def test_the_replay_buffer_wraps_around_and_keeps_the_newest():
    buf = ReplayBuffer(5, 1, 1)
    for i in range(3):
        x = torch.full((2, 1), float(i))
        buf.add(x, x, x[:, 0], x, torch.zeros(2))
    assert buf.size == 5 and sorted(buf.obs.flatten().tolist()) == [0.0, 1.0, 1.0, 2.0, 2.0]


def test_sac_learns_a_one_step_bandit():
    """Reward −(a − 0.5)²: the actor's mean must move to 0.5 (terminal steps, so Q is the reward)."""
    sac = SAC(1, 1, SACConfig(hidden=32, batch_size=256, init_alpha=0.01, lr=3e-3, buffer_size=4096), seed=0)
    g = torch.Generator().manual_seed(0)
    a = torch.rand(4096, 1, generator=g) * 2 - 1
    sac.add(torch.zeros(4096, 1), a, -(a[:, 0] - 0.5) ** 2, torch.zeros(4096, 1), torch.ones(4096))
    for _ in range(600):
        sac.update()
    with torch.no_grad():
        best = sac.actor(torch.zeros(1, 1), deterministic=True)[0]
    assert abs(float(best) - 0.5) < 0.1


@pytest.mark.slow
def test_sac_solves_pendulum_within_20000_env_steps():
    pytest.importorskip("gymnasium")
    from redisync.torch.ab.pendulum import validate

    result = validate(steps=20_000)
    print(f"Pendulum-v1: -250 first reached after {result.first_step_reaching(-250)} env steps, best {result.best:.0f}; "
          f"curve (env steps, average return of 10 episodes): {result.curve}")
    assert result.best >= -250, result.curve


# ---------------------------------------------------------------- the pipeline


class ConstantDriftEnv:
    """A user's own env, to show the interface suffices: a 1-D mass whose profile decides where it falls."""

    obs_dim, act_dim, step_dt = 3, 1, 0.02

    def __init__(self, profiles: torch.Tensor, seed: int):
        self.num_envs, self.num_frames = len(profiles), 4 * 50 - 1
        self.profiles = profiles
        self.frames = torch.zeros(self.num_envs, dtype=torch.long)
        self.x = torch.zeros(self.num_envs)
        self.g = torch.Generator().manual_seed(seed)

    def reset(self, env_ids, start_frames):
        self.frames[env_ids] = start_frames
        self.x[env_ids] = 0.0

    def observations(self):
        return torch.stack([self.x, self.frames.float() / self.num_frames, self.profiles.float()], 1)

    def step(self, actions):
        self.frames = (self.frames + 1).clamp(max=self.num_frames - 1)
        bin_ = self.frames * 4 // self.num_frames
        kick = (bin_ == self.profiles % 4).float() * torch.randn(self.num_envs, generator=self.g)
        self.x = self.x + 0.1 * actions[:, 0] + kick
        terminated = self.x.abs() > 1.0
        truncated = ~terminated & (self.frames >= self.num_frames - 1)
        return Step(self.observations(), torch.exp(-self.x**2), terminated, truncated)


def user_env_factory(task):
    return lambda profiles, seed: ConstantDriftEnv(profiles, seed)


TINY = replace(StudyConfig().smoke(), env_steps=3_000, learning_starts=1_000, eval_every=1_500, drift_every=500,
               sac=SACConfig(hidden=32, batch_size=128))


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_a_users_own_env_runs_through_the_store(backend):
    url = real_redis_or_skip() if backend == "real" else None
    cfg = replace(TINY, task=replace(TINY.task, bins=4))
    run = run_arm(cfg, "pooled", seed=0, url=url, make_env=load_env_factory("tests.test_ab:user_env_factory", cfg))
    assert run["publishes"] > 0 and len(run["curve"]) == 2 and len(run["curve"][0]["survival"]) == 4
    assert run["drift"] and all(len(d["tv"]) == cfg.shards and d["buffer_tv"] is not None for d in run["drift"])


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_the_learner_reads_each_shards_drift_back_from_the_store(backend):
    """Two unsynced shards failing in different bins: each is far from the pooled distribution,
    their mixture (what the buffer gets) much closer; the probe of a `uniform` shard reports uniform."""
    import uuid

    import redisync
    from redisync.syncer import Syncer
    from redisync.torch import AdaptiveMotionSampler
    from redisync.torch.ab.fleet import DriftProbe, fleet_drift

    url = real_redis_or_skip() if backend == "real" else None
    store = redisync.connect(url, run=f"t-drift-{uuid.uuid4().hex[:8]}")
    try:
        probes = []
        for shard, hard_bin in ((0, 1), (1, 3)):
            sampler = AdaptiveMotionSampler(4 * 50 - 1, 0.02, mode="local", alpha=0.5)
            probe = DriftProbe(sampler, 0.02)
            for term in (sampler, probe):
                term.record_failures(torch.full((10,), hard_bin * 50 + 5), torch.ones(10, dtype=torch.bool))
                term.step()
            syncer = Syncer(redisync.connect(url, run=store.run), shard, [sampler, probe]).start()
            syncer.stop()  # flushes the reports
            probes.append(probe)
        drift = fleet_drift(store, probes[0].sampler.uniform_ratio)
        assert len(drift["tv"]) == 2 and min(drift["tv"]) > 0.3
        assert drift["buffer_tv"] < min(drift["tv"]) / 3
        uniform = DriftProbe(probes[0].sampler, 0.02, uniform=True).report_shard_state()[DriftProbe.USED]["sum"]
        assert np.allclose(uniform, 0.25)
    finally:
        store.delete()


def test_a_wrong_env_spec_is_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match="module:function"):
        load_env_factory("tests.test_ab", TINY)
    with pytest.raises(ValueError, match="cannot import 'no_such_module'"):
        load_env_factory("no_such_module:make", TINY)
    with pytest.raises(ValueError, match="has no 'no_such_factory'"):
        load_env_factory("tests.test_ab:no_such_factory", TINY)
    out = subprocess.run([sys.executable, "-m", "redisync.cli", "ab", "--env", "no_such_module:make", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "--env" in out.stderr and "no_such_module" in out.stderr and "Traceback" not in out.stderr


def test_the_smoke_study_learns_and_shows_drift_only_without_sync(tmp_path):
    """CI's run of the whole pipeline: `single` must beat a random policy clearly, `local` shards
    must drift from the pooled distribution while `pooled` shards agree with it."""
    out = subprocess.run([sys.executable, "-m", "redisync.cli", "ab", "--smoke", "--arms", "single,local,pooled",
                          "--seeds", "2", "--out", str(tmp_path), "--no-progress"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    per_arm = results["summary"]["per_arm"]
    random_return = results["random"]["return"]
    assert per_arm["single"]["final_return"]["lo"] > 2 * random_return + 10
    assert per_arm["local"]["mean_drift_tv"]["mean"] > 0.05
    assert per_arm["pooled"]["mean_drift_tv"]["mean"] < per_arm["local"]["mean_drift_tv"]["mean"] / 3
    report = (tmp_path / "report.md").read_text()
    assert "## Conclusion" in report and "redisync ab --smoke" in report and "| `local` |" in report
    for png in ("learning_curves.png", "survival_heatmap.png", "drift.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_unknown_arms_are_refused_by_name():
    out = subprocess.run([sys.executable, "-m", "redisync.cli", "ab", "--arms", "pooled,telepathy", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "telepathy" in out.stderr and "pooled" in out.stderr
    assert set(ARMS) >= {"single", "local", "pooled", "weighted", "broadcast"}


def _fake_results(final_returns: dict[str, list[float]]) -> dict:
    """Results of a study whose runs differ only in their final return, as ``summarise`` sees them."""
    from redisync.torch.ab.study import SUMMARY_METRICS, summarise

    runs = []
    for arm, values in final_returns.items():
        for seed, v in enumerate(values):
            summary = {m: 1.0 for m in SUMMARY_METRICS} | {"final_return": v, "reached_threshold": 1.0, "wall_s": 1.0}
            runs.append({"arm": arm, "seed": seed, "summary": summary})
    arms = list(final_returns)
    return {"arms": arms, "seeds": list(range(len(values))), "runs": runs, "summary": summarise(runs, arms)}


def test_the_conclusion_names_a_difference_only_where_its_interval_excludes_zero():
    from redisync.torch.ab.report import conclusion

    rng = np.random.default_rng(0)
    base = 40 + rng.normal(0, 1, 6)
    same = _fake_results({"single": list(base), "local": list(base[::-1]), "pooled": list(rng.permutation(base))})
    text = "\n".join(conclusion(same))
    assert "`local` and `pooled` differ on no training metric" in text and "worse on" not in text
    hurt = _fake_results({"single": list(base), "local": list(base - 10), "pooled": list(rng.permutation(base))})
    text = "\n".join(conclusion(hurt))
    assert "`local` vs `pooled`: worse on final_return by -10 " in text
    assert "`pooled` and `single` differ on no training metric" in text
