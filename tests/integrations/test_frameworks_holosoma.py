"""The holosoma drop-in inside the real holosoma 0.0.3: its curriculum manager and terms (the G1
locomotion preset), its own ``synchronize_curriculum_state`` over gloo beside redisync's through
the store, and redisync's curriculum terms against holosoma's state and defaults."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import pytest
import torch
import torch.multiprocessing as mp

import redisync
from redisync.terms.torch import AverageEpisodeLength

from ..conftest import framework_or_skip

pytestmark = pytest.mark.frameworks
framework_or_skip("holosoma.managers.curriculum.terms.locomotion")
from holosoma.config_values.loco.g1.curriculum import g1_29dof_curriculum  # noqa: E402
from holosoma.envs.locomotion.locomotion_manager import LeggedRobotLocomotionManager  # noqa: E402
from holosoma.managers.curriculum.manager import CurriculumManager  # noqa: E402
from holosoma.managers.curriculum.terms.locomotion import PenaltyCurriculum  # noqa: E402

from redisync.integrations import ProcessFleet  # noqa: E402
from redisync.integrations.holosoma import sync_curriculum  # noqa: E402

PENALTY = g1_29dof_curriculum.setup_terms["penalty_curriculum"].params


@dataclass(frozen=True)
class RewardTermCfg:
    weight: float
    tags: list[str] = field(default_factory=list)


class RewardManager:
    """The part of holosoma's reward manager its penalty curriculum uses."""

    def __init__(self):
        self.cfgs = {"feet_slip": RewardTermCfg(-1.0, ["penalty_curriculum"]), "tracking": RewardTermCfg(2.0)}
        self.active_terms = list(self.cfgs)

    def get_term_cfg(self, name: str) -> RewardTermCfg:
        return self.cfgs[name]

    def set_term_cfg(self, name: str, cfg: RewardTermCfg) -> None:
        self.cfgs[name] = cfg


class LocomotionEnv:
    """holosoma's locomotion manager around its real curriculum manager, without a simulator: the
    methods that touch the curriculum are holosoma's own."""

    BASE_NUM_ENVS = LeggedRobotLocomotionManager.BASE_NUM_ENVS
    _get_average_episode_tracker = LeggedRobotLocomotionManager._get_average_episode_tracker
    average_episode_length = LeggedRobotLocomotionManager.average_episode_length
    synchronize_curriculum_state = LeggedRobotLocomotionManager.synchronize_curriculum_state
    get_checkpoint_state = LeggedRobotLocomotionManager.get_checkpoint_state

    def __init__(self, num_envs: int = 64):
        self.num_envs, self.device, self.log_dict = num_envs, "cpu", {}
        self._pending_episode_lengths = torch.zeros(num_envs, dtype=torch.long)
        self._pending_episode_update_mask = torch.zeros(num_envs, dtype=torch.bool)
        self.reward_manager = RewardManager()
        self.curriculum_manager = CurriculumManager(g1_29dof_curriculum, self, "cpu")
        self.curriculum_manager.setup()

    def end_episodes(self, lengths: torch.Tensor) -> None:
        """Envs 0..n-1 end episodes of these lengths and are reset (the tracker, then the penalty)."""
        ids = torch.arange(lengths.numel())
        self._pending_episode_lengths[ids] = lengths
        self._pending_episode_update_mask[ids] = True
        self.curriculum_manager.reset(ids)
        self.curriculum_manager.step()

    @property
    def penalty(self) -> PenaltyCurriculum:
        return next(t for _, t in self.curriculum_manager.iter_terms() if isinstance(t, PenaltyCurriculum))

    def state(self) -> tuple[float, float, float]:
        return (
            float(self._get_average_episode_tracker().get_average()),
            float(self.reward_penalty_scale),
            self.penalty.current_scale,
        )


def episodes(rank: int, round_: int, long: float = 900.0) -> torch.Tensor:
    """Rank 0 keeps its robots up (long episodes, the scale goes up); rank 1's fall early."""
    g = torch.Generator().manual_seed(100 * rank + round_)
    base = long if rank == 0 else 100.0
    return (base + 40 * torch.randn(48, generator=g)).clamp(min=1).long()


def _rank(rank: int, init: str, url: str, run: str, rounds: int, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    upstream, ours = LocomotionEnv(), LocomotionEnv()
    # reports only at the syncs (no cadence), so the comparison with holosoma's broadcast is step for step
    fleet = ProcessFleet(
        redisync.connect(url, run=run), rank, worker="thread", publish_every_steps=10**9, publish_every_s=1e9
    )
    sync_curriculum(ours, fleet=fleet)  # starts the fleet: the run is registered before the first rollout
    states: dict[str, list] = {"upstream": [], "ours": []}
    for r in range(rounds):
        for env in (upstream, ours):
            env.end_episodes(episodes(rank, r))
        upstream.synchronize_curriculum_state(device="cpu", world_size=2)  # holosoma's: two broadcasts
        version = [0]
        if rank == 0:  # the test's own ordering: the owner's publish is pulled before the other shard syncs
            ours.synchronize_curriculum_state(device="cpu", world_size=2)
            assert fleet.syncer.wait_synced(timeout=60)  # (a bound for a loaded machine: 10 s ran out once)
            version = [fleet.syncer.worker._ready.fleet_version]
        dist.broadcast_object_list(version, src=0)
        if rank == 1:
            assert fleet.syncer.wait_synced(at_least=version[0], timeout=60)
            ours.synchronize_curriculum_state(device="cpu", world_size=2)
        states["upstream"].append(upstream.state())
        states["ours"].append(ours.state())
    fleet.stop()
    out[rank] = states
    dist.destroy_process_group()


def test_the_tracker_and_penalty_decide_alike_through_redisync_and_through_holosomas_broadcast(real_url, tmp_path):
    """Under torchrun, holosoma's episode tracker and penalty curriculum decide alike whether they sync
    through redisync or through holosoma's own broadcast."""
    run, rounds = f"t-{uuid.uuid4().hex[:12]}", 12
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", real_url, run, rounds, out), nprocs=2, join=True)
        out = dict(out)
    redisync.connect(real_url, run=run).delete()
    for rank in (0, 1):
        for (avg_up, logged_up, _), (avg_ours, logged_ours, _) in zip(
            out[rank]["upstream"], out[rank]["ours"], strict=False
        ):
            assert avg_ours == avg_up  # the tracker after a sync: rank 0's average, bit for bit
            assert logged_ours == pytest.approx(
                logged_up, rel=1e-6
            )  # the penalty scale (holosoma's goes through float32)
    owner_scales = [s[2] for s in out[0]["ours"]]
    assert owner_scales[-1] > PENALTY["initial_scale"]  # the owner's long episodes raised the scale
    assert [s[2] for s in out[1]["ours"]] == owner_scales  # and redisync applied it where the rewards use it
    # holosoma's broadcast set only the logged copy: rank 1's rewards kept its own, lower scale
    assert out[1]["upstream"][-1][2] < owner_scales[-1]


def _collector(rank: int, url: str, run: str, mode: str, rounds: int, handshake, shared) -> None:
    """One single-process collector (no process group): its env resets and steps; nobody calls
    synchronize_curriculum_state (holosoma's agents call it only when multi-GPU). The collectors
    start together, and halfway the other one waits until it holds a fleet state with the owner's
    reports (the test's own ordering: a loaded machine may start one process seconds late)."""
    env = LocomotionEnv()
    fleet = ProcessFleet(redisync.connect(url, run=run), rank, worker="thread", publish_every_steps=1)
    sync_curriculum(env, fleet=fleet, episode_length=mode, penalty_scale="broadcast")
    env.synchronize_curriculum_state = None  # never called in this topology: a call would fail
    handshake.wait(timeout=120)
    rows = []
    for r in range(rounds):
        if r == rounds // 2:
            if rank == 0:
                assert fleet.syncer.wait_synced(timeout=60)
                shared["version"] = fleet.syncer.worker._ready.fleet_version
            handshake.wait(timeout=120)
            if rank == 1:
                assert fleet.syncer.wait_synced(at_least=shared["version"], timeout=60)
        # (rank 0's 1 500 steps and rank 1's 100 pool to about 800, above holosoma's level-up threshold of
        # 750: the owner's scale rises whether it decides on its own average or on the fleet's; alone,
        # rank 1's 100, below the level-down threshold of 150, would lower its own)
        env.end_episodes(episodes(rank, r, long=1500.0))  # the curriculum manager's reset (the decisions) and step
        tracker = env._get_average_episode_tracker()
        rows.append(
            (float(tracker.average_episode_length), float(env.average_episode_length), env.penalty.current_scale)
        )
        time.sleep(0.05)  # a collector's step time: the worker publishes and pulls meanwhile
    fleet.stop()
    shared[rank] = rows


@pytest.mark.parametrize("mode", ["broadcast", "pooled"])
def test_single_process_collectors_sync_the_curriculum_without_its_sync_call(real_url, mode):
    """Single-process collectors (no process group) sync holosoma's curriculum through redisync, where
    holosoma's own sync call would do nothing."""
    run, rounds = f"t-{uuid.uuid4().hex[:12]}", 40
    ctx = mp.get_context("spawn")
    with mp.Manager() as manager:
        out, handshake = manager.dict(), manager.Barrier(2)
        procs = [
            ctx.Process(target=_collector, args=(rank, real_url, run, mode, rounds, handshake, out)) for rank in (0, 1)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        out = dict(out)
    redisync.connect(real_url, run=run).delete()
    assert PENALTY["level_down_threshold"] > 100  # rank 1 alone would lower its scale
    assert PENALTY["level_up_threshold"] < (1500 + 100) / 2  # the fleet's mean raises the owner's, in both modes
    owner, other = out[0], out[1]
    owner_scales = {row[2] for row in owner}
    assert owner[-1][2] > PENALTY["initial_scale"]  # the owner's long episodes raise its scale
    late = other[rounds // 2 :]
    # during the run (not only at stop), the other collector's rewards use the owner's penalty scale
    assert all(row[2] in owner_scales for row in late), (late, sorted(owner_scales))
    assert late[-1][2] > PENALTY["initial_scale"]  # alone, its short episodes would have lowered it
    if mode == "broadcast":  # its tracker holds the owner's average after each reset
        owner_avgs = {row[0] for row in owner}
        assert all(row[0] in owner_avgs for row in late)
    else:  # it keeps its own average and decides on the fleet's weighted mean, between its own and the owner's
        for own, decided, _ in late:
            assert own < decided < max(row[0] for row in owner)


def test_pooled_trackers_decide_on_the_fleets_weighted_mean(real_url):
    """Pooled episode trackers decide their penalty on the fleet's weighted mean episode length, alike in
    every collector."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    envs = [LocomotionEnv(), LocomotionEnv()]
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), shard, worker="thread") for shard in (0, 1)]
    syncs = [
        sync_curriculum(env, fleet=fleet, episode_length="pooled", penalty_scale="local")
        for env, fleet in zip(envs, fleets, strict=False)
    ]
    try:
        for rank, env in enumerate(envs):
            env.end_episodes(episodes(rank, 0)[: 10 + 30 * rank])
        for sync in syncs:
            sync()
        for fleet in fleets:  # both reports are in the store ...
            assert fleet.syncer.wait_synced(timeout=10)
        version = fleets[0].syncer.store.fleet().fleet_version
        for fleet, sync in zip(fleets, syncs, strict=False):  # ... and both shards pulled them before their next sync
            assert fleet.syncer.wait_synced(at_least=version, timeout=10)
            sync()
        trackers = [env._get_average_episode_tracker() for env in envs]
        weights = [min(s.terms[0].episodes, t.num_compute_average_epl) for s, t in zip(syncs, trackers, strict=False)]
        want = sum(w * float(t.average_episode_length) for w, t in zip(weights, trackers, strict=False)) / sum(weights)
        assert weights == [10, 15]  # 10 episodes; 40 capped at the window of 64 envs (1 000 × 64 / 4 096)
        for env in envs:
            assert env.average_episode_length == pytest.approx(want, rel=1e-6)  # what the penalty decides on
        assert float(trackers[0].average_episode_length) != float(trackers[1].average_episode_length)  # own, unchanged
        for env in envs:  # the env's log_dict, which holosoma's agents log as Env/...: the fleet's metrics
            env.curriculum_manager.step()
            assert torch.is_tensor(env.log_dict["redisync/healthy"])
            assert float(env.log_dict["redisync/healthy"]) == 1.0
            assert "redisync/staleness_versions" in env.log_dict
    finally:
        for fleet in fleets:
            fleet.stop()
        fleets[0].syncer.store.delete()


def test_redisyncs_tracker_has_holosomas_window_and_loads_its_checkpoint_state():
    """redisync's tracker has holosoma's window for the env count, tracks as holosoma's does and loads
    holosoma's checkpoint state."""
    env = LocomotionEnv(num_envs=1024)
    tracker = env._get_average_episode_tracker()
    ours = AverageEpisodeLength(num_envs=1024)
    assert ours.window == tracker.num_compute_average_epl == 250
    lengths = torch.arange(1, 301, dtype=torch.float)
    tracker.update(torch.arange(300), lengths)
    ours.update(lengths)
    assert ours.own_average == pytest.approx(float(tracker.get_average()), rel=1e-6)
    checkpoint = env.get_checkpoint_state()  # holosoma's: the tracker's state and the penalty scale
    restored = AverageEpisodeLength(num_envs=1024)
    restored.load_state_dict(checkpoint["average_episode_tracker"])
    assert restored.own_average == pytest.approx(float(tracker.get_average()))
    tracker.load_state_dict(ours.state_dict())  # and back
    assert float(tracker.get_average()) == pytest.approx(ours.own_average)


@pytest.mark.parametrize(
    ("episodes_behind", "others"), [(0, (0.0, 0.0)), (0, (5.0, 600.0)), (40, (0.0, 0.0)), (40, (5.0, 600.0))]
)
def test_the_holosoma_drop_in_and_redisyncs_tracker_pool_the_episode_length_alike(episodes_behind, others):
    """One pooled episode length: holosoma's tracker under the drop-in and redisync's own term give
    the same fleet average for the same state, nothing counted included (each shard's own average)."""
    from redisync.integrations.holosoma import TrackerSync

    env = LocomotionEnv(num_envs=64)
    tracker = env._get_average_episode_tracker()
    tracker.set_average(120.0, suppress_update=False)
    synced = TrackerSync(tracker, "pooled", shard_id=0, owner=0)
    synced.episodes, synced._fleet = episodes_behind, others
    ours = AverageEpisodeLength(num_envs=64, mode="pooled")
    ours.own_average, ours.episodes, ours._others = 120.0, episodes_behind, others
    assert float(synced.pooled_average()) == pytest.approx(ours.value, rel=1e-6)
    if others == (0.0, 0.0):
        assert ours.value == 120.0  # nobody else counted: the shard's own average, not 0
