"""Terms on a CUDA device: reports and fleet states that never wait for the device.

The copies' bookkeeping (two pinned buffers each way, an event per copy, a report handed over only
once its copy has landed) is tested here on the CPU with events the test completes by hand; the
device's branch-free formulas against the host's; the terms' device paths against their CPU paths
with the device's checks made true. The tests marked ``cuda`` run the same on a GPU with
``torch.cuda.set_sync_debug_mode("error")`` around the hot path (``scripts/gpu-check``); they are
skipped where ``torch.cuda.is_available()`` is false.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import numpy as np
import pytest
import torch

from redisync.collector.seam import schema_of
from redisync.terms import formulas
from redisync.terms.torch import (
    AdaptiveMotionSampler,
    SyncedEmpiricalNormalization,
    TerrainLevels,
    curriculum,
    normalization,
    sampler,
)
from redisync.terms.torch.device import DeviceFleet, DeviceReports
from redisync.terms.torch.ops import TorchOps

from ..support import sync


class HandEvent:
    """A CUDA event's stand-in whose copy lands when the test says so (``landed``), or at once."""

    made: ClassVar[list[HandEvent]] = []

    def __init__(self, auto: bool = False):
        self.recorded, self.landed, self.auto, self.waited = False, False, auto, 0
        HandEvent.made.append(self)

    def record(self) -> None:
        self.recorded, self.landed = True, self.auto

    def query(self) -> bool:
        return self.landed

    def synchronize(self) -> None:
        self.waited += 1
        self.landed = True


def test_a_report_is_handed_over_only_once_its_copy_has_landed_and_none_is_waited_for():
    """A device report is handed over only once its copy has landed, and the hot path never waits for a copy."""
    reports = DeviceReports(3, pin=False, event=HandEvent)
    first, second, third = HandEvent.made[-2], HandEvent.made[-1], None
    assert reports.report(torch.tensor([1.0, 2.0, 3.0])) is None  # queued; nothing has landed
    assert reports.report(torch.tensor([4.0, 5.0, 6.0])) is None  # the second buffer
    assert reports.report(torch.tensor([7.0, 8.0, 9.0])) is None  # both in flight: not started, not waited for
    assert reports.skipped == 1
    first.landed = True
    got = reports.report(torch.tensor([10.0, 11.0, 12.0]))  # the first landed: handed over; its buffer reused
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0])
    assert reports.skipped == 1
    second.landed = True
    np.testing.assert_array_equal(reports.report(torch.tensor([0.0, 0.0, 0.0])), [4.0, 5.0, 6.0])
    assert first.waited == second.waited == 0  # the hot path never waited
    np.testing.assert_array_equal(reports.settle(torch.tensor([3.0, 2.0, 1.0])), [3.0, 2.0, 1.0])
    assert first.waited + second.waited >= 1  # a settle waits for what is in flight
    assert third is None


def test_a_fleet_state_is_queued_from_a_free_buffer_or_left_for_the_next_boundary():
    """A fleet state is copied to the device from a free buffer, or left for the next boundary when none is
    free."""
    fleet = DeviceFleet(2, pin=False, event=HandEvent)
    into = torch.zeros(2, dtype=torch.float64)
    assert fleet.copy(np.array([1.0, 2.0]), into)
    assert fleet.copy(np.array([3.0, 4.0]), into)
    assert torch.equal(into, torch.tensor([3.0, 4.0], dtype=torch.float64))
    assert not fleet.copy(np.array([5.0, 6.0]), into)  # both buffers still being read: nothing written
    assert fleet.deferred == 1
    assert torch.equal(into, torch.tensor([3.0, 4.0], dtype=torch.float64))
    HandEvent.made[-2].landed = True
    assert fleet.copy(np.array([5.0, 6.0]), into)
    assert torch.equal(into, torch.tensor([5.0, 6.0], dtype=torch.float64))


class DeviceOps(TorchOps):
    """The torch operations as on a device: no value read on the host."""

    def on_host(self, x):
        return False


@pytest.mark.parametrize("mix", ["code", "paper"])
@pytest.mark.parametrize("scale", [1.0, 1e38])  # 1e38: float32 sums overflow, the rescaled path is taken
def test_the_device_builds_the_same_distributions_without_reading_a_value(mix, scale):
    """The device path builds the same distributions as the host without reading a value back."""
    ema = torch.rand(40, generator=torch.Generator().manual_seed(3)) * scale
    layout = sampler.BinLayout((40,), "cpu")
    kernel = torch.tensor([0.6, 0.3, 0.1])
    host = formulas.grouped_probabilities(ema, layout, 0.1, kernel, sampler.TORCH, mix)
    device = formulas.grouped_probabilities(ema, layout, 0.1, kernel, DeviceOps(), mix)
    assert torch.isfinite(host).all()
    assert torch.equal(host, device)


@pytest.fixture
def device_paths(monkeypatch):
    """The terms' CUDA paths taken on the CPU: their device checks true, their buffers unpinned, each
    copy landing at the next query (as a fast device's would)."""
    for module in (sampler, normalization, curriculum):
        monkeypatch.setattr(module, "on_device", lambda t: True)
        monkeypatch.setattr(module, "DeviceReports", functools.partial(DeviceReports, pin=False, event=_landing))
    for module in (sampler, normalization):
        monkeypatch.setattr(module, "DeviceFleet", functools.partial(DeviceFleet, pin=False, event=_landing))


def _landing() -> HandEvent:
    return HandEvent(auto=True)


def _fleet(make_store, build, shards=2):
    store = make_store()
    terms = [[build(s)] for s in range(shards)]
    store.register(schema_of(terms[0]))
    return store, [store.shard(s) for s in range(shards)], terms


def _step_sampler(term, rng, steps):
    for _ in range(steps):
        t = torch.as_tensor(rng.integers(0, 500, 64))
        failed = torch.as_tensor(rng.random(64) < 0.2)
        term.record_failures(t, failed)
        term.step()


@pytest.mark.parametrize("mode", ["pooled", "broadcast"])
def test_a_sampler_on_the_device_path_samples_what_the_cpu_path_does_a_publish_later(make_store, device_paths, mode):
    """Two shards synced through the store on the device path, and two on the CPU path whose
    reports are the device path's as of its first report: the device path's reports lag one publish
    (its first hands over nothing), its distributions are rebuilt at the boundary and equal the CPU
    path's bit for bit, and a settled report is the current state."""

    def build(s):
        return AdaptiveMotionSampler(500, 0.02, mode=mode, shard_id=s, alpha=0.05)

    store, clients, device = _fleet(make_store, build)
    rng = [np.random.default_rng(s) for s in range(2)]
    for s in range(2):
        _step_sampler(device[s][0], rng[s], 20)
    assert [device[s][0].report_shard_state() for s in range(2)] == [{}, {}]  # queued, not landed
    reported = [device[s][0].bin_failed_count.clone() for s in range(2)]
    for s in range(2):
        _step_sampler(device[s][0], rng[s], 20)
    sync(store, clients, device)  # hands over the copies made at the first report, applies the fleet
    got = [device[s][0].probabilities().clone() for s in range(2)]
    assert device[1][0].fleet_version > 0
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(sampler, "on_device", lambda t: False)
        cpu_store, cpu_clients, cpu = _fleet(make_store, build)
        for s in range(2):
            cpu[s][0].set_own_ema(reported[s])
        sync(cpu_store, cpu_clients, cpu)
        for s in range(2):
            cpu[s][0].set_own_ema(device[s][0].bin_failed_count)
            assert torch.equal(got[s], cpu[s][0].probabilities())
    part = device[0][0].settle()[device[0][0].key]  # shard 0: pooled, or the broadcast's owner
    np.testing.assert_array_equal(part.get("sum", part.get("value")), device[0][0].bin_failed_count.double().numpy())


def test_an_observing_sampler_on_the_device_path_reports_its_measured_drift_a_publish_later(make_store, device_paths):
    """An observing sampler on the device path measures its drift with device kernels and hands it
    over in the same copy as its EMA: nothing before a fleet state arrived, then, a publish later,
    the drift of the state copied - the distance its CPU path measures of that state."""

    def build(s):
        return AdaptiveMotionSampler(500, 0.02, mode="observe", shard_id=s, alpha=0.05)

    store, clients, device = _fleet(make_store, build)
    rng = [np.random.default_rng(s) for s in range(2)]
    for s in range(2):
        _step_sampler(device[s][0], rng[s], 20)
        assert device[s][0].report_shard_state() == {}  # queued, not landed
    sync(store, clients, device)  # the first copies handed over; the fleet state arrives
    term = device[0][0]
    assert term.fleet_version > 0
    drift_key = term.key + ".drift_tv"
    first = term.report_shard_state()  # the copy queued before the fleet arrived: no drift in it
    assert term.key in first
    assert drift_key not in first
    with pytest.MonkeyPatch.context() as undo:  # what the CPU path reports of the state just copied
        undo.setattr(sampler, "on_device", lambda t: False)
        expected = term.report_shard_state()[drift_key]["sum"]
    queued_ema = term.bin_failed_count.double().numpy().copy()
    _step_sampler(term, rng[0], 5)
    got = term.report_shard_state()  # the copy queued at the call before: its EMA and its drift
    np.testing.assert_array_equal(got[term.key]["sum"], queued_ema)
    assert got[drift_key]["sum"].shape == (1,)
    assert got[drift_key]["sum"][0] > 0
    np.testing.assert_array_equal(got[drift_key]["sum"], expected)


def test_a_weighted_sampler_on_the_device_path_counts_each_failure_in_one_report(device_paths):
    """The failures since the last report are kept on the device and reported with the EMA copied
    beside them: each failure counted in exactly one report, none while no copy could start."""
    term = AdaptiveMotionSampler(500, 0.02, mode="weighted", shard_id=0, alpha=0.05)
    rng, failures, counts = np.random.default_rng(0), [], []
    for _ in range(4):
        before = 0
        for _ in range(10):
            t = torch.as_tensor(rng.integers(0, 500, 64))
            failed = torch.as_tensor(rng.random(64) < 0.2)
            before += int(failed.sum())
            term.record_failures(t, failed)
            term.step()
        failures.append(before)
        got = term.report_shard_state()
        counts.append(got[term.key]["count"] if got else None)
    assert counts[0] is None
    assert counts[1:] == [float(f) for f in failures[:-1]]  # a publish late, every failure once
    assert term.settle()[term.key]["count"] == failures[-1]


def test_a_normaliser_on_the_device_path_reaches_the_cpu_paths_moments(make_store, device_paths):
    """Pooled normalisers on the device path and on the CPU path, fed the same batches and synced
    after the device path's reports have landed, hold the same mean, var and count."""

    def build(s):
        return SyncedEmpiricalNormalization(3, mode="pooled")

    store, clients, device = _fleet(make_store, build)
    batches = [[torch.randn(16, 3, generator=torch.Generator().manual_seed(10 * s + k)) * (s + 1) for k in range(4)]
               for s in range(2)]  # fmt: skip
    for s in range(2):
        for x in batches[s]:
            device[s][0].update(x)
    assert all(not device[s][0].report_shard_state() for s in range(2))  # queued, not landed
    sync(store, clients, device)  # the copies made above land and are reported
    sync(store, clients, device)
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(normalization, "on_device", lambda t: False)
        cpu_store, cpu_clients, cpu = _fleet(make_store, build)
        for s in range(2):
            for x in batches[s]:
                cpu[s][0].update(x)
        sync(cpu_store, cpu_clients, cpu)
        for s in range(2):
            torch.testing.assert_close(device[s][0].mean, cpu[s][0].mean, rtol=0, atol=0)
            torch.testing.assert_close(device[s][0].std, cpu[s][0].std, rtol=0, atol=0)
            assert int(device[s][0].count) == int(cpu[s][0].count) == 128


def test_a_resumed_normaliser_on_the_device_path_weighs_its_checkpoint_as_the_cpu_path_does(make_store, device_paths):
    """A pooled normaliser loaded from a checkpoint of 1 000 samples, in a fleet whose other shard
    has seen 990 and after 16 of its own: the checkpoint stands in for the fleet only while it holds
    more than the fleet and this shard together (1 000 < 1 006: the fleet's moments, count 1 006),
    decided on the device path from the host's tally as on the CPU path from the counts."""
    store = make_store()
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(normalization, "on_device", lambda t: False)
        source, other = SyncedEmpiricalNormalization(3, mode="pooled"), SyncedEmpiricalNormalization(3, mode="pooled")
        source.update(torch.randn(1000, 3, generator=torch.Generator().manual_seed(1)) * 3 + 1)
        other.update(torch.randn(990, 3, generator=torch.Generator().manual_seed(2)) - 2)
        store.register(schema_of([other]))
        store.shard(1).publish(other.report_shard_state())
    checkpoint, batch = source.state_dict(), torch.randn(16, 3, generator=torch.Generator().manual_seed(3))

    def resumed():
        term = SyncedEmpiricalNormalization(3, mode="pooled")
        term.load_state_dict(checkpoint)
        term.update(batch)
        client = store.shard(0)
        client.pull()
        term.apply_shard_state(client.known)
        return term

    device = resumed()
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(normalization, "on_device", lambda t: False)
        cpu = resumed()
    assert int(device.count) == int(cpu.count) == 1006
    torch.testing.assert_close(device.mean, cpu.mean, rtol=0, atol=0)
    torch.testing.assert_close(device.std, cpu.std, rtol=0, atol=0)


def test_terrain_levels_on_the_device_path_report_their_histogram_a_publish_later(device_paths):
    """Terrain levels on the device path report their histogram one publish later, and settle() reports the
    current one."""
    levels = TerrainLevels(32, 5, mode="pooled", generator=torch.Generator().manual_seed(0))
    assert levels.report_shard_state() == {}
    before = levels.histogram()
    levels.update(torch.arange(32), torch.ones(32, dtype=torch.long), torch.zeros(32, dtype=torch.long))
    np.testing.assert_array_equal(levels.report_shard_state()[levels.key]["sum"], before)
    np.testing.assert_array_equal(levels.settle()[levels.key]["sum"], levels.histogram())


def test_what_a_slow_device_left_undone_is_counted_in_the_syncers_metrics(make_store, monkeypatch):
    """A device that lands no copy: the terms start no third report and defer the third fleet state,
    and ``metrics()`` counts both (summed over the terms) instead of staying silent; on the CPU both
    counts are zero."""
    from redisync import new_syncer

    monkeypatch.setattr(sampler, "on_device", lambda t: True)
    monkeypatch.setattr(normalization, "on_device", lambda t: True)
    stuck = functools.partial(HandEvent, auto=False)
    for module in (sampler, normalization):
        monkeypatch.setattr(module, "DeviceReports", functools.partial(DeviceReports, pin=False, event=stuck))
        monkeypatch.setattr(module, "DeviceFleet", functools.partial(DeviceFleet, pin=False, event=stuck))
    store = make_store()
    terms = [
        AdaptiveMotionSampler(500, 0.02, mode="pooled", shard_id=0),
        SyncedEmpiricalNormalization(3, mode="pooled"),
    ]
    syncer = new_syncer(store, 0, terms, worker="thread", publish_every_steps=10**9, publish_every_s=1e9)
    assert syncer.metrics()["redisync/device_reports_skipped"] == 0.0
    for _ in range(3):  # two copies queued, the third not started
        for term in terms:
            term.report_shard_state()
    store.register(schema_of(terms))
    other, mine = store.shard(1), store.shard(0)
    for k in range(3):  # two fleet states queued into the device, the third deferred
        other.publish({terms[0].key: {"count": 1.0, "sum": np.full(terms[0].bin_count, k + 1.0)}})
        mine.pull()
        terms[0].apply_shard_state(mine.known)
    metrics = syncer.metrics()
    assert metrics["redisync/device_reports_skipped"] == 2.0  # one per term
    assert metrics["redisync/device_fleet_deferred"] == 1.0
    assert terms[1].device_copies() == {"device_reports_skipped": 1, "device_fleet_deferred": 0}


@pytest.mark.parametrize("role", ["pooled", "learner's writer", "learner's follower"])
def test_a_syncers_start_makes_the_device_buffers_the_hot_path_then_uses(make_store, device_paths, role):
    """Pinned memory is made (a blocking call) when the syncer starts, not at the first report or
    boundary: each copy a term's role makes; the hot path then uses those buffers, sized for what it
    copies."""
    from redisync import new_syncer

    store = make_store()
    norm = SyncedEmpiricalNormalization(3, mode=role.split("'")[0], writer=role == "learner's writer")
    terms = (
        [norm]
        if role != "pooled"
        else [
            AdaptiveMotionSampler(500, 0.02, mode="pooled", shard_id=0),
            norm,
            TerrainLevels(16, 4, mode="pooled", generator=torch.Generator().manual_seed(0)),
        ]
    )
    expected = {  # (reports copied out, fleet states copied in), per term
        "pooled": [(True, True), (True, True), (True, False)],
        "learner's writer": [(True, False)],
        "learner's follower": [(False, True)],
    }[role]

    def made():
        return [(t._device_reports, getattr(t, "_device_fleet", None)) for t in terms]

    assert made() == [(None, None)] * len(terms)
    syncer = new_syncer(store, 0, terms, worker="thread", publish_every_steps=10**9, publish_every_s=1e9).start()
    try:
        buffers = made()
        assert [(r is not None, f is not None) for r, f in buffers] == expected
        for term in terms:
            term.report_shard_state()
            term.report_shard_state()  # the second hands over the first copy: the buffer's size fits
        assert made() == buffers
        assert syncer.flush()
    finally:
        syncer.stop(flush=False)


# ------------------------------------------------------------------ on a GPU (scripts/gpu-check)


def _cuda_fleet(make_store, worker):
    from redisync import new_syncer

    store = make_store()
    terms = [
        [
            AdaptiveMotionSampler(500, 0.02, mode="pooled", shard_id=s, alpha=0.05, device="cuda"),
            SyncedEmpiricalNormalization(8, mode="pooled").to("cuda"),
            TerrainLevels(256, 6, mode="pooled", device="cuda"),
        ]
        for s in range(2)
    ]
    syncers = [new_syncer(store, s, terms[s], worker=worker, publish_every_steps=1) for s in range(2)]
    return store, terms, syncers


@pytest.mark.cuda
@pytest.mark.parametrize("worker", ["thread", "process"])
def test_on_a_gpu_the_hot_path_never_synchronises_with_the_device(make_store, backend, worker):
    """Many steps with a publish every step and fleet states applied at every boundary, under
    ``set_sync_debug_mode("error")`` around ``on_step()`` and ``at_reset_boundary()``: nothing
    synchronises; the pooled distribution on the device then equals the CPU reference."""
    if worker == "process" and backend == "embedded":
        pytest.skip("the sidecar worker needs a Redis URL (the embedded store lives in the collector's process)")
    _, terms, syncers = _cuda_fleet(make_store, worker)
    for s in syncers:
        s.start()
    try:
        applied = 0
        for step in range(400):
            for s, mine in zip(syncers, terms, strict=True):
                sam, norm, lev = mine
                t = torch.randint(0, 500, (256,), device="cuda")
                sam.record_failures(t, torch.rand(256, device="cuda") < 0.1)
                sam.step()
                norm.update(torch.randn(256, 8, device="cuda"))
                ended = torch.arange(0, 256, 7, device="cuda")
                up = torch.rand(ended.shape[0], device="cuda") < 0.5
                lev.update(ended, up.long(), (~up).long())
                torch.cuda.set_sync_debug_mode("error")
                try:
                    s.on_step()
                    applied += bool(s.at_reset_boundary())
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            if step % 50 == 0:
                syncers[0].wait_synced(timeout=10)
        assert applied > 0
        own = [mine[0].bin_failed_count.double().cpu() for mine in terms]
        mine = terms[0][0]
        for _ in range(50):  # until shard 0 holds shard 1's settled EMA (decided by the state, not a time)
            for s in syncers:
                assert s.flush()
            for s in syncers:
                s.wait_synced(timeout=5)
                s.at_reset_boundary()
            torch.cuda.synchronize()
            if torch.equal(mine._fleet.cpu(), own[1]):
                break
        assert torch.equal(mine._fleet.cpu(), own[1])
        reference = sampler.sampling_probabilities(
            (own[0] + own[1]).to(mine.bin_failed_count.dtype), mine.uniform_ratio, mine.kernel.cpu(), mine.uniform_mix
        )
        torch.testing.assert_close(mine.probabilities().cpu(), reference, rtol=1e-5, atol=1e-7)
    finally:
        for s in syncers:
            s.stop()


@pytest.mark.cuda
def test_on_a_gpu_an_observing_sampler_measures_its_drift_without_synchronising(make_store):
    """Observing samplers on a GPU, a publish every step, under ``set_sync_debug_mode("error")``
    around ``on_step()`` and ``at_reset_boundary()``: nothing synchronises, and every shard's measured
    drift reaches the store (its ``<key>.drift_tv`` slot), as on the CPU."""
    from redisync import new_syncer

    store = make_store()
    terms = [
        [AdaptiveMotionSampler(500, 0.02, mode="observe", shard_id=s, alpha=0.05, device="cuda")] for s in range(2)
    ]
    syncers = [new_syncer(store, s, terms[s], worker="thread", publish_every_steps=1).start() for s in range(2)]
    try:
        for step in range(200):
            for shard, (s, (sam,)) in enumerate(zip(syncers, terms, strict=True)):
                t = torch.randint(0, 250 + 250 * shard, (256,), device="cuda")  # (the shards fail apart)
                sam.record_failures(t, torch.rand(256, device="cuda") < 0.1)
                sam.step()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    s.on_step()
                    s.at_reset_boundary()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            if step % 50 == 0:
                syncers[0].wait_synced(timeout=10)
        for s in syncers:
            assert s.flush()
        key = terms[0][0].key + ".drift_tv"
        view = store.shard(0).pull().keys[key]
        assert view.value is not None
        assert float(view.parts()["count"]) == 2.0
    finally:
        for s in syncers:
            s.stop()
