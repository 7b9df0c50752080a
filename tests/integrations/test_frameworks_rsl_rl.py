"""The rsl_rl drop-in inside the real rsl-rl-lib 5.5.1: its models' normalisers swapped for synced
ones, checkpoints both ways, the fleet's statistics equal to rsl_rl's all-reduce, and no collective."""

from __future__ import annotations

import copy
import datetime
import time
import uuid

import pytest
import torch
import torch.multiprocessing as mp

import redisync
from redisync.errors import ConfigurationError

from ..conftest import framework_or_skip

pytestmark = pytest.mark.frameworks
rsl_rl = framework_or_skip("rsl_rl")
from rsl_rl.models import MLPModel  # noqa: E402
from rsl_rl.modules import EmpiricalNormalization  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from redisync.integrations import ProcessFleet  # noqa: E402
from redisync.integrations.rsl_rl import SyncedNormalization, normalizer_slots, sync_normalizers  # noqa: E402


def models(normalization: bool = True) -> tuple[MLPModel, MLPModel]:
    obs = TensorDict({"policy": torch.zeros(8, 5), "privileged": torch.zeros(8, 3)}, batch_size=[8])
    groups = {"actor": ["policy"], "critic": ["policy", "privileged"]}
    actor = MLPModel(obs, groups, "actor", 2, hidden_dims=(16,), obs_normalization=normalization)
    critic = MLPModel(obs, groups, "critic", 1, hidden_dims=(16,), obs_normalization=normalization)
    return actor, critic


class Algorithm:  # what sync_normalizers walks: an rsl_rl algorithm's model attributes, aliases included
    def __init__(self, actor: MLPModel, critic: MLPModel):
        self.actor, self.critic, self._raw_actor = actor, critic, actor


def batches(seed: int, n: int = 4, rows: int = 64, dim: int = 5) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, dim, generator=g) * (1 + seed) + seed for _ in range(n)]


def test_the_models_normalisers_are_replaced_with_their_state_and_checkpoints_load_both_ways(real_url):
    """rsl_rl models' normalisers are replaced keeping their statistics, and checkpoints load both ways
    between synced and plain models."""
    actor, critic = models()
    for x in batches(0):
        actor.obs_normalizer.update(x)
    before = {k: v.clone() for k, v in actor.obs_normalizer.state_dict().items()}
    fleet = ProcessFleet(redisync.connect(real_url, run=f"t-{uuid.uuid4().hex[:12]}"), 0)
    try:
        assert sync_normalizers(Algorithm(actor, critic), fleet=fleet) is fleet
        assert fleet.syncer is not None  # started here, with the task built, not in the first env step
        assert [t.key for t in fleet.terms] == ["rsl_rl/actor.obs_normalizer", "rsl_rl/critic.obs_normalizer"]
        synced = actor.obs_normalizer
        assert isinstance(synced, SyncedNormalization)
        assert not normalizer_slots(actor)
        assert synced.state_dict().keys() == before.keys()
        assert all(torch.equal(synced.state_dict()[k], v) for k, v in before.items())  # same state
        # rsl_rl's checkpoint of the model loads into the synced one, and back
        ref_actor, _ = models()
        ref_actor.load_state_dict(actor.state_dict())
        x = torch.randn(3, 5)
        assert torch.equal(ref_actor.obs_normalizer(x), synced(x))
        actor.load_state_dict(ref_actor.state_dict())
        # the model's own paths: forward normalises, update_normalization learns, and ONNX-style copies detach
        obs = TensorDict({"policy": x, "privileged": torch.zeros(3, 3)}, batch_size=[3])
        assert actor(obs).shape == (3, 2)
        actor.update_normalization(obs)
        assert int(synced.count) == int(before["count"]) + 3  # the checkpoint's prior plus the new samples
        assert copy.deepcopy(synced).fleet is None
    finally:
        fleet.stop()
        fleet.syncer.store.delete()


def test_a_model_without_normalisation_is_refused():
    """A model without observation normalisation is refused, naming the setting."""
    actor, critic = models(normalization=False)
    with pytest.raises(ConfigurationError, match="obs_normalization=True"):
        sync_normalizers(Algorithm(actor, critic), fleet=ProcessFleet(redisync.connect(None), 0))


def test_pooled_normalisers_hold_what_rsl_rls_all_reduce_computes(real_url):
    """Two shards update with different data; after a sync, both normalise with the statistics
    rsl_rl's normaliser would hold had it been fed every batch of both (what its all-reduce makes)."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    fleets = [ProcessFleet(redisync.connect(real_url, run=run), shard, worker="thread") for shard in (0, 1)]
    actors = [models()[0] for _ in fleets]
    reference = EmpiricalNormalization(5)
    try:
        for fleet, actor in zip(fleets, actors, strict=False):
            sync_normalizers(actor, fleet=fleet)
        for _step, (a, b) in enumerate(zip(batches(1), batches(2), strict=False)):
            actors[0].obs_normalizer.update(a)
            actors[1].obs_normalizer.update(b)
            reference.update(torch.cat([a, b]))
        for fleet in fleets:
            fleet.syncer.flush()
        for fleet in fleets:
            assert fleet.syncer.wait_synced(timeout=10)
        final = fleets[0].syncer.store.fleet().fleet_version  # both published: each waits for the other's too
        for fleet in fleets:
            assert fleet.syncer.wait_synced(final, timeout=10)
        for fleet, actor in zip(fleets, actors, strict=False):
            fleet.at_reset_boundary()
            synced = actor.obs_normalizer
            assert int(synced.count) == int(reference.count) == 2 * 4 * 64
            torch.testing.assert_close(synced._mean, reference._mean, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(synced._var, reference._var, rtol=1e-4, atol=1e-5)
    finally:
        for fleet in fleets:
            fleet.stop()
        fleets[0].syncer.store.delete()


def _rank(rank: int, init: str, url: str, run: str, out: dict) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=3))
    try:
        if rank == 1:  # a straggler: it never reaches the normaliser during the other rank's updates
            time.sleep(6)
            return
        x = torch.randn(32, 5)
        upstream = EmpiricalNormalization(5)
        started = time.monotonic()
        try:
            upstream.update(x)  # all-reduces: waits for rank 1 until the group's timeout
            out["upstream"] = "returned"
        except RuntimeError as e:
            out["upstream"] = f"failed after {time.monotonic() - started:.1f} s: {type(e).__name__}"
        actor = models()[0]
        fleet = ProcessFleet(redisync.connect(url, run=run), 0, worker="thread")
        sync_normalizers(actor, fleet=fleet)
        started = time.monotonic()
        for _ in range(10):
            actor.obs_normalizer.update(x)
        out["synced_s"] = time.monotonic() - started
        out["synced_count"] = int(actor.obs_normalizer.count)
        fleet.stop()
    finally:
        dist.destroy_process_group()


def test_the_synced_normaliser_runs_no_collective_where_rsl_rls_waits_for_a_straggler(real_url, tmp_path):
    """Under torchrun the synced normaliser runs no collective, where rsl_rl's own waits for a straggling
    rank."""
    run = f"t-{uuid.uuid4().hex[:12]}"
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(f"file://{tmp_path}/rendezvous", real_url, run, out), nprocs=2, join=True)
        out = dict(out)
    redisync.connect(real_url, run=run).delete()
    assert out["upstream"].startswith("failed after")  # rsl_rl 5.5.1 waited for the straggler, then gave up
    assert out["synced_count"] == 10 * 32
    assert out["synced_s"] < 2.0


def _ppo_rank(rank: int, init: str, url: str, run: str, synced: bool, out: dict) -> None:
    """One rank of rsl_rl's PPO under torchrun's data parallelism (gloo), 8 env steps and one update,
    every collective it makes counted; rank 1 is 2 s late to its update (a straggler)."""
    import torch.distributed as dist
    from rsl_rl.algorithms import PPO
    from rsl_rl.storage import RolloutStorage

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    counts: dict[str, int] = {}
    for name in ("all_reduce", "broadcast", "all_gather", "reduce", "all_gather_into_tensor", "reduce_scatter"):
        original = getattr(dist, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _original(*args, **kwargs)

        setattr(dist, name, counted)
    torch.manual_seed(rank)
    obs = TensorDict({"policy": torch.zeros(8, 5), "privileged": torch.zeros(8, 3)}, batch_size=[8])
    groups = {"actor": ["policy"], "critic": ["policy", "privileged"]}
    actor = MLPModel(
        obs,
        groups,
        "actor",
        2,
        hidden_dims=(16,),
        obs_normalization=True,
        distribution_cfg={"class_name": "rsl_rl.modules.distribution:GaussianDistribution"},
    )
    critic = MLPModel(obs, groups, "critic", 1, hidden_dims=(16,), obs_normalization=True)
    obs = TensorDict({"policy": torch.randn(8, 5), "privileged": torch.randn(8, 3)}, batch_size=[8])
    storage = RolloutStorage("rl", 8, 8, obs, [2], "cpu")
    alg = PPO(
        actor,
        critic,
        storage,
        num_learning_epochs=2,
        num_mini_batches=2,
        multi_gpu_cfg={"global_rank": rank, "local_rank": rank, "world_size": 2},
    )
    fleet = None
    if synced:
        fleet = ProcessFleet(redisync.connect(url, run=run), rank, worker="thread")
        sync_normalizers(Algorithm(alg.actor, alg.critic), fleet=fleet)
    alg.broadcast_parameters()
    for _ in range(8):
        obs = TensorDict({"policy": torch.randn(8, 5), "privileged": torch.randn(8, 3)}, batch_size=[8])
        alg.act(obs)
        alg.process_env_step(obs, torch.randn(8), torch.zeros(8, dtype=torch.bool), {})
        for name in ("actor", "critic"):
            getattr(alg, name).update_normalization(obs)
    alg.compute_returns(obs)
    if rank == 1:
        time.sleep(2.0)
    started = time.monotonic()
    alg.update()
    out[rank] = (dict(counts), time.monotonic() - started)
    if fleet is not None:
        fleet.stop()
    dist.destroy_process_group()


@pytest.mark.slow  # two spawned ranks, twice: ~16 s
def test_data_parallel_ppo_keeps_its_gradient_collectives_so_a_straggler_still_costs_the_others(real_url, tmp_path):
    """What redisync removes under torchrun is the normaliser's collectives (and the curriculum's);
    the gradient all-reduce and the parameter broadcast stay rsl_rl's, and with them the wait."""
    seen = {}
    for synced in (False, True):
        run = f"t-{uuid.uuid4().hex[:12]}"
        with mp.Manager() as manager:
            out = manager.dict()
            mp.spawn(
                _ppo_rank,
                args=(f"file://{tmp_path}/rendezvous-{synced}", real_url, run, synced, out),
                nprocs=2,
                join=True,
            )
            seen[synced] = dict(out)
        redisync.connect(real_url, run=run).delete()
    plain, synced = seen[False][0][0], seen[True][0][0]
    print(
        f"collectives per rank: rsl_rl's normaliser {plain}, synced {synced}; rank 0's update with the straggler: "
        f"{seen[False][0][1]:.2f} s / {seen[True][0][1]:.2f} s"
    )
    assert sum(plain.values()) > sum(synced.values()) > 0  # fewer, not none: the gradients still all-reduce
    assert synced.get("broadcast", 0) >= 1
    assert synced.get("all_reduce", 0) >= 1
    assert seen[True][0][1] > 1.5  # rank 0 still waited for rank 1's gradients


def test_a_runners_logger_writes_the_fleets_metrics_to_tensorboard(tmp_path):
    """rsl_rl's own Logger, with its TensorBoard writer: given a runner, sync_normalizers puts the
    fleet's health, staleness and drift into each step's extras, which rsl_rl writes as scalars."""
    from rsl_rl.utils.logger import Logger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = Logger(
        str(tmp_path), {"algorithm": {}, "logger": "tensorboard", "num_steps_per_env": 2}, {}, 4, False, 1, 0, "cpu"
    )
    logger.init_logging_writer()
    runner = type("Runner", (), {})()  # what sync_normalizers reads of an OnPolicyRunner: alg and logger
    runner.alg, runner.logger = Algorithm(*models()), logger
    fleet = ProcessFleet(redisync.connect(None, run=f"t-{uuid.uuid4().hex[:12]}"), 0)
    try:
        sync_normalizers(runner, fleet=fleet)
        for _ in range(2):
            logger.process_env_step(torch.zeros(4), torch.zeros(4), {"log": {"Episode_Reward/x": torch.tensor(1.0)}})
        logger.log(1, 0, 2, 0.1, 0.1, {"value": 0.0}, 1e-3, torch.ones(2), None, print_minimal=True)
        logger.writer.flush()
    finally:
        fleet.stop()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "redisync/healthy" in tags, tags
    assert events.Scalars("redisync/healthy")[-1].value == 1.0
    assert "redisync/staleness_versions" in tags
    assert "Episode_Reward/x" in tags  # the env's own extras are still there
