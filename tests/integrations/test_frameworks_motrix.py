"""The MotrixLab drop-in on MotrixLab's real structure, inside the real async FastSAC of
``motrix-rl-builtin`` 0.4.0: a WBT-style task of ours on ``motrix-env-core``'s ``ManagerEnv``
(:mod:`tests.motrix_task`: a frozen ``@kernel_data`` command term with the published
``WbtMotionCommand``'s layout), registered the way MotrixLab registers its WBT tasks, trained with 2,
3 and 4 spawned collectors, each collector failing in its own segment of the motion."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest

import redisync
from redisync.errors import ConfigurationError
from redisync.learner import FleetMonitor

from ..conftest import framework_or_skip

pytestmark = [pytest.mark.frameworks, pytest.mark.slow, pytest.mark.integration]
framework_or_skip("motrix_rl_builtin.fastsac.async_impl.train")
from motrix_env_core.manager import (  # noqa: E402
    CommandCfg,
    CommandTerm,
    ManagerContext,
    ManagerEnv,
    SharedArray,
    dispatch,
    kernel_data,
)

from redisync.integrations.motrix import SyncedManagerEnv, synced  # noqa: E402
from redisync.store.schema import DEFAULT_LEASE_GRACE_S  # noqa: E402

from .motrix_task import (  # noqa: E402
    FRAMES,
    HARD_SEGMENTS,
    KILL_AT,
    TRACE,
    MotionCommandCfg,
    TrackingCfg,
    command_cdf,
)
from .motrix_task.train import train  # noqa: E402

KEY = "motion/bin_failed"
BINS = FRAMES // 50 + 1


def hard_bins(collector: int) -> slice:
    start, end = HARD_SEGMENTS[collector % len(HARD_SEGMENTS)]
    return slice(start * BINS // FRAMES, (end - 1) * BINS // FRAMES + 1)


@pytest.fixture
def fleet_run(real_url, tmp_path, monkeypatch):
    """Runs of the task against one redisync run on the real Redis; the run deleted afterwards."""
    run = f"motrix-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("REDISYNC_URL", real_url)
    monkeypatch.setenv("REDISYNC_RUN", run)
    made: list[int] = []

    def go(
        env: str, collectors: int, iterations: int, *, kill: str | None = None, num_envs: int = 64
    ) -> dict[int, dict]:
        trace = tmp_path / f"trace{len(made)}"
        trace.mkdir()
        made.append(1)
        monkeypatch.setenv(TRACE, str(trace))
        if kill:
            monkeypatch.setenv(KILL_AT, kill)
        else:
            monkeypatch.delenv(KILL_AT, raising=False)
        started = time.perf_counter()
        if kill:  # the trainer stops when a collector dies (the one killed, or one it then stopped)
            with pytest.raises(RuntimeError, match=r"exit code -?\d+"):
                train(env, tmp_path / "runs", collectors=collectors, iterations=iterations, num_envs=num_envs)
        else:
            train(env, tmp_path / "runs", collectors=collectors, iterations=iterations, num_envs=num_envs)
        print(f"{env}: {collectors} collectors, {iterations} iterations in {time.perf_counter() - started:.1f} s")
        return {i: dict(np.load(trace / f"collector{i}.npz")) for i in range(collectors)}

    yield go, redisync.connect(real_url, run=run)
    redisync.connect(real_url, run=run).delete()


def pooled(store) -> tuple[np.ndarray, float, str]:
    monitor = FleetMonitor(store)
    monitor.refresh()
    parts = monitor.state.keys[KEY].parts()
    writers = store.redis.hget(store.keys.key_meta(KEY), "writers").decode()
    return parts["sum"], float(parts["count"]), writers


def assert_samples_from(t: dict, ema_of_row) -> None:
    """Every CDF the collector's command built is its formula applied to the EMA the mode chose (float32)."""
    for k, cdf in enumerate(t["cdf"]):
        np.testing.assert_allclose(cdf, command_cdf(ema_of_row(k).astype(np.float32)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("collectors", [2, 4])
def test_async_collectors_sample_from_the_pooled_failure_ema(fleet_run, collectors):
    """MotrixLab's asynchronous collectors sample their starts from the pooled failure EMA once the fleet
    state arrives."""
    go, store = fleet_run
    traces = go("redisync-wbt", collectors, 200)
    for i, t in traces.items():
        # the fleet state arrives (how many resets come before the first pull depends on the machine's
        # load) and, once there, stays: the version a collector samples from never goes back
        synced_rows = t["version"] > 0
        assert synced_rows.any(), f"collector {i} never held fleet state in {len(synced_rows)} resets"
        first = int(synced_rows.argmax())
        assert synced_rows[first:].all()
        assert (np.diff(t["version"][first:]) >= 0).all()
        # every draw came from the command's own formula applied to the fleet's EMA (others as pulled + own now)
        assert_samples_from(t, lambda k, t=t: t["fleet"][k] + t["own"][k])
        assert np.abs(t["fleet"][-1]).sum() > 0  # which holds the other collectors' failures
        # the kernels' array: never rebound (one address from the first reset to the last), float32
        assert len(set(t["ptr"].tolist())) == 1
        assert t["final"].dtype == np.float32
    for i, t in traces.items():
        # at some reset once synced, the draw put more mass where another collector fails than the
        # collector's own EMA would have (not necessarily the last: a collector that finished first
        # has left the pooled EMA by then, as its lease was given up)
        rows = np.flatnonzero(t["version"] > 0)
        pooled_p = np.diff(t["cdf"][rows], axis=1, prepend=0)
        alone = np.diff(np.stack([command_cdf(t["own"][k]) for k in rows]), axis=1, prepend=0)  # unsynced draws
        for j in traces:
            if HARD_SEGMENTS[i % 2] != HARD_SEGMENTS[j % 2]:
                where = hard_bins(j)
                more = pooled_p[:, where].sum(axis=1) > alone[:, where].sum(axis=1)
                assert more.any(), f"collector {i} ignores where collector {j} fails"
    assert_stopped_cleanly(store, traces)


def assert_stopped_cleanly(store, traces: dict[int, dict]) -> None:
    """At exit each collector published its last EMA, then gave its lease up: a stopped collector leaves
    the pooled EMA at the next fold, so the store holds exactly the last EMAs of those whose last fold
    came after the others had stopped (at least the last one), each once."""
    total, count, writers = pooled(store)
    ids = [int(w) for w in writers.split(",") if w]
    assert 1 <= len(ids) == count
    assert set(ids) <= set(traces)
    np.testing.assert_allclose(total, sum(traces[i]["final"].astype(np.float64) for i in ids), rtol=1e-6, atol=1e-9)
    assert all(store.redis.hget(store.keys.shards, f"{i}:alive_until_us") == b"-1" for i in traces)


def test_the_run_trains_as_without_redisync(fleet_run):
    """A MotrixLab run steps and resets every collector with redisync as without it; unsynced, each collector
    samples from its own EMA only, synced from the fleet's."""
    go, _ = fleet_run
    plain = go("redisync-wbt-plain", 2, 150)
    synced_run = go("redisync-wbt", 2, 150)
    for traces in (plain, synced_run):
        assert all(len(t["cdf"]) > 0 for t in traces.values())  # every collector stepped and reset
    # unsynced, each collector draws from its own EMA only and never sees where the other fails
    for t in plain.values():
        assert_samples_from(t, lambda k, t=t: t["own"][k])
        assert np.abs(t["fleet"]).sum() == 0
    assert all(np.abs(t["fleet"][-1]).sum() > 0 for t in synced_run.values())


def test_a_killed_collector_restarted_is_not_counted_twice(fleet_run):
    """A MotrixLab collector killed and restarted is not counted twice: its new life replaces the old."""
    go, store = fleet_run
    go("redisync-wbt", 2, 2000, kill="1:30")  # collector 1 SIGKILLed at its 30th reset; the trainer stops
    again = go("redisync-wbt", 2, 150)  # the run restarted: both shards start new lives
    assert_stopped_cleanly(store, again)  # the killed life's slot is nowhere: each shard counted once at most


def test_a_killed_collector_that_never_returns_leaves_the_pool_by_its_lease(fleet_run):
    """Default settings: no stale_after_s. Three collectors; collector 2 is SIGKILLed and never comes
    back; its lease lapses and, a grace period later, the restarted two-collector run's folds leave
    its EMA out: the live collectors sample only from each other's."""
    go, store = fleet_run
    first = go("redisync-wbt", 3, 2000, kill="2:40", num_envs=48)  # (the envs divide evenly across collectors)
    assert np.abs(first[2]["own"][-1]).sum() > 0
    _, _, writers = pooled(store)
    assert "2" in writers.split(",")
    lapse = int(store.redis.hget(store.keys.shards, "2:lease_until_us")) / 1e6 + DEFAULT_LEASE_GRACE_S
    wait = lapse - redisync.store.client.server_time_us(store.redis) / 1e6 + 0.5
    assert wait <= 5.0 + DEFAULT_LEASE_GRACE_S + 1  # the dead collector's lease ran out within one lease
    # leases run out in the time the server serves the run (a stall, or nobody calling, counts at most
    # Limits.stall_after_s): while the trainer is down, a standby shard's renewals keep the run's clock going
    deadline = time.monotonic() + max(0.0, wait)
    while time.monotonic() < deadline:
        store.lease(90, 1, 5_000)
        time.sleep(0.5)
    before = store.fleet().fleet_version  # the restarted run's first fold, past the grace, leaves shard 2 out
    again = go("redisync-wbt", 2, 150, num_envs=48)  # restarted with two collectors: shard 2 never comes back
    _, _, writers = pooled(store)
    assert "2" not in writers.split(",")
    assert_stopped_cleanly(store, again)
    for i in (0, 1):  # once synced, each collector's fleet part is the other live collector's EMA alone
        t, other = again[i], again[1 - i]
        late = np.flatnonzero(t["version"] > before)
        assert late.size, f"collector {i} never held a fleet state made after shard 2 left"
        # (an EMA the other held while it ran: not its final one, which moved on after its last
        # publish; shard 2's would come on top of it)
        held = np.abs(t["fleet"][late[-1]]).sum()
        assert held <= np.abs(other["own"]).sum(axis=1).max() * 1.05 + 1e-6
    meta = store.redis.hgetall(store.keys.key_meta(KEY))
    assert int(meta[b"dropped_lapsed"]) >= 1


def test_broadcast_collectors_sample_from_the_owners_ema(fleet_run):
    """In broadcast mode the owner samples from its own EMA and the others from the owner's as received."""
    go, _ = fleet_run
    traces = go("redisync-wbt-broadcast", 2, 150)
    owner, other = traces[0], traces[1]
    assert_samples_from(owner, lambda k: owner["own"][k])  # the owner (shard 0) samples from its own EMA
    received = np.flatnonzero(other["version"] > 0)
    assert received.size
    for k in received:  # the other from the owner's
        np.testing.assert_allclose(
            other["cdf"][k], command_cdf(other["fleet"][k].astype(np.float32)), rtol=1e-6, atol=1e-7
        )
    assert np.abs(other["fleet"][-1] - other["own"][-1]).sum() > 0  # which is not its own


# the one line a WBT user adds, and bad configuration: in the parent process (no fleet), where
# MotrixLab builds its probe env before spawning the collectors


def test_the_guides_motrix_block_registers_a_synced_manager_env():
    """The frameworks guide's MotrixLab block registers a synced ManagerEnv as written."""
    from motrix_env_core import registry

    from ..test_docs import block_after

    marker = "<!-- the MotrixLab registration: tests/integrations/test_frameworks_motrix.py runs this block -->"
    block = block_after(marker)[1]
    name = f"readme-wbt-{uuid.uuid4().hex[:6]}"
    registry.envcfg(name)(TrackingCfg)  # MotrixLab's task package registers the G1 config under its name
    scope: dict = {}
    exec(compile(block.replace('"g1-wbt-dance"', repr(name)), "frameworks.md", "exec"), scope)
    spec = registry.resolve(name)
    assert spec.env_cls is SyncedManagerEnv
    env = spec.make(num_envs=2)  # outside a collector process: no fleet, local sampling
    assert env.redisync_fleet is None
    assert isinstance(env, ManagerEnv)


def _env(cls, commands: dict):
    from motrix_env_core.mdp.observations import ActionsObsCfg

    cfg = TrackingCfg()
    cfg.commands = commands
    cfg.observations = {"policy": {"action": ActionsObsCfg(action_name="phase")}}
    return cls(cfg, num_envs=2)


@kernel_data
class InertCommand(CommandTerm):  # a command term whose kernels do nothing: the fields are the point
    @dispatch
    def update(self, ctx: ManagerContext) -> None:
        pass

    @dispatch
    def advance(self, ctx: ManagerContext) -> None:
        pass

    @dispatch
    def reset_env(self, ctx: ManagerContext) -> None:
        pass

    def reset(self, ctx) -> None:
        pass


@kernel_data
class ScalarEma(InertCommand):  # a command whose "EMA" is a number, not an array the kernels share
    adaptive_bin_failed_count: np.float32


class ScalarEmaCfg(CommandCfg):
    def __call__(self, env):
        return ScalarEma(command=np.zeros((env.num_envs, 3), np.float32), adaptive_bin_failed_count=np.float32(0))


@kernel_data
class SecondAdaptive(InertCommand):  # another command with an adaptive sampler (an array, this time)
    adaptive_bin_failed_count: SharedArray


class SecondAdaptiveCfg(CommandCfg):
    def __call__(self, env):
        return SecondAdaptive(
            command=np.zeros((env.num_envs, 3), np.float32), adaptive_bin_failed_count=np.zeros(4, np.float32)
        )


class DisabledAdaptiveCfg(CommandCfg):
    """What WbtMotionCommandCfg(adaptive_sampling_enabled=False) makes: an adaptive EMA of 0 bins."""

    def __call__(self, env):
        return SecondAdaptive(
            command=np.zeros((env.num_envs, 3), np.float32), adaptive_bin_failed_count=np.zeros(0, np.float32)
        )


def test_a_disabled_adaptive_sampler_runs_unsynced_saying_so_once(monkeypatch, caplog):
    """A command whose adaptive sampling is disabled has nothing to sync: every collector runs with
    its own start frames, with one log line (every collector died at start: a 0-bin key)."""
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "name", "fastsac-async-collector-0")
    monkeypatch.setattr("redisync.integrations.motrix._said_disabled", [], raising=False)
    with caplog.at_level("INFO", logger="redisync.integrations.motrix"):
        envs = [_env(SyncedManagerEnv, {"motion": DisabledAdaptiveCfg()}) for _ in range(2)]
    assert all(env.redisync_fleet is None and env.redisync_ema is None for env in envs)
    said = [r.getMessage() for r in caplog.records if "adaptive sampler of its command is disabled" in r.getMessage()]
    assert len(said) == 1, said


def test_bad_configuration_is_a_typed_error_naming_the_env_the_terms_and_what_to_set(monkeypatch):
    """A bad MotrixLab configuration is a typed error naming the env, the terms and what to set."""
    cases = [
        (SyncedManagerEnv, {}, "register the plain ManagerEnv for it, or set REDISYNC_MODE=local", "none"),
        (
            SyncedManagerEnv,
            {"motion": MotionCommandCfg(), "second": SecondAdaptiveCfg()},
            "2 command terms hold",
            "second (SecondAdaptive)",
        ),
        (SyncedManagerEnv, {"motion": ScalarEmaCfg()}, "not a 1-D or 2-D float numpy array (got float32", "motion"),
        (
            synced(ManagerEnv, command="tracking"),
            {"motion": MotionCommandCfg()},
            "no command term 'tracking'",
            "motion (MotionCommand)",
        ),
    ]
    for cls, commands, what, terms in cases:
        with pytest.raises(ConfigurationError) as e:
            _env(cls, commands)
        message = str(e.value)
        assert what in message, message
        assert terms in message, message
        assert cls.__name__ in message  # the env
    with pytest.raises(ConfigurationError, match="unknown mode 'pool'"):
        synced(ManagerEnv, mode="pool")
    monkeypatch.setenv("REDISYNC_MODE", "pool")
    with pytest.raises(
        ConfigurationError, match=r"unknown redisync mode 'pool' \(from \$REDISYNC_MODE\).*pooled, broadcast, local"
    ):
        _env(SyncedManagerEnv, {"motion": MotionCommandCfg()})
    # two candidates, one named: fine
    monkeypatch.setenv("REDISYNC_MODE", "pooled")
    monkeypatch.setenv("REDISYNC_COMMAND", "second")
    env = _env(SyncedManagerEnv, {"motion": MotionCommandCfg(), "second": SecondAdaptiveCfg()})
    assert env.redisync_fleet is None


# the pooling against one unsharded command: collectors in lockstep, failures chosen by the test

ROUNDS, ALPHA = 12, np.float32(MotionCommandCfg().alpha)


def _failures(shard: int, rounds: int) -> np.ndarray:
    """What shard ``shard``'s envs fail per round and bin: each shard its own part of the motion."""
    g = np.random.default_rng(shard)
    out = np.zeros((rounds, BINS), dtype=np.float32)
    where = hard_bins(shard)
    out[:, where] = g.integers(0, 4, size=(rounds, where.stop - where.start))
    out[:, shard % BINS] += 1
    return out


def _lockstep_collector(index: int, url: str, run: str, collectors: int, barrier, out: dict) -> None:
    import multiprocessing
    import os

    multiprocessing.current_process().name = f"fastsac-async-collector-{index}"  # as MotrixLab names them
    os.environ.update(REDISYNC_URL=url, REDISYNC_RUN=run)
    env = SyncedManagerEnv(TrackingCfg(), num_envs=4)
    env.init_state()
    command = env.command_terms["motion"]
    ema, current, cdf = (
        command.adaptive_bin_failed_count,
        command.adaptive_current_bin_failed_count,
        command.sampling_cdf,
    )
    addresses = {a.__array_interface__["data"][0] for a in (ema, current, cdf)}
    ema[:] = 0.0  # the first reset recorded the framework's initial flags: start every shard from nothing
    current[:] = 0.0
    syncer, store = env.redisync_fleet.syncer, redisync.connect(url, run=run)
    failures, rows = _failures(index, ROUNDS), []
    for t in range(ROUNDS):
        current += failures[t]  # what the command's reset records when this shard's envs fail
        env.compute_transition(env.state)  # the transition kernel, the terms' on_transition (the EMA fold), a step
        env.redisync_fleet.flush()
        assert syncer.wait_synced(timeout=30)
        barrier.wait(60)  # every shard's report of round t is folded
        assert syncer.wait_synced(at_least=store.fleet().fleet_version, timeout=30)
        env.state.terminated[:] = False
        env.reset(np.arange(4))  # the command's reset: its CDF from the fleet's EMA
        rows.append(cdf.copy())
        barrier.wait(60)
    same = addresses == {a.__array_interface__["data"][0] for a in (ema, current, cdf)}
    from motrix_rl.utils import env_infos  # the step infos MotrixLab's collectors send to the learner's logger

    logged = {k: v for k, v in env_infos(env.state)["metrics"].items() if k.startswith("redisync/")}
    env.redisync_fleet.stop()
    out[index] = (np.array(rows), same, ema.dtype.str, logged)


@pytest.mark.parametrize("collectors", [3])
def test_lockstep_collectors_build_the_cdf_of_one_unsharded_command(real_url, collectors):
    """Three spawned collector processes, each on its own ManagerEnv with the synced command, step in
    lockstep with failures the test chooses; after each round every collector's CDF is the one an
    unsharded command fed every collector's failures builds (float32)."""
    import multiprocessing

    run = f"motrix-{uuid.uuid4().hex[:8]}"
    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager:
        out, barrier = manager.dict(), ctx.Barrier(collectors)
        procs = [
            ctx.Process(target=_lockstep_collector, args=(i, real_url, run, collectors, barrier, out))
            for i in range(collectors)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(300)
        out = dict(out)
    redisync.connect(real_url, run=run).delete()
    assert [p.exitcode for p in procs] == [0] * collectors
    unsharded = np.zeros(BINS, dtype=np.float32)  # one command over every collector's envs
    for t in range(ROUNDS):
        seen = sum(_failures(i, ROUNDS)[t] for i in range(collectors)).astype(np.float32)
        unsharded = ALPHA * seen + (np.float32(1.0) - ALPHA) * unsharded
        want = command_cdf(unsharded)
        for i in range(collectors):
            rows, same, dtype, _ = out[i]
            np.testing.assert_allclose(rows[t], want, rtol=0, atol=2e-6, err_msg=f"collector {i}, round {t}")
    for i in range(collectors):
        _, same, dtype, logged = out[i]
        assert same
        assert dtype == "<f4"
        assert logged["redisync/healthy"] == 1.0, logged  # in the infos MotrixLab's learner logs
        assert "redisync/staleness_versions" in logged
