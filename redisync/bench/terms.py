"""Collector-side figures for ``redisync bench``: the syncer's cost on a collector loop, CDF rebuilds."""

from __future__ import annotations

import functools
import statistics
import time
import uuid
from typing import Any

import torch

from ..collector.syncer import Syncer
from ..collector.workers import new_syncer
from ..store.client import connect
from ..terms.torch.normalization import SyncedEmpiricalNormalization
from ..terms.torch.sampler import FPS, AdaptiveMotionSampler, frames_for_bins

STEP_S = 1e-3
REBUILD_SHAPES = (
    (1, 100),
    (1, 1000),
    (1, 10000),
    (1000, 100),
)  # (groups, bins per group): 1 000 motions x 100 bins last


def _calibrated_step() -> tuple[torch.Tensor, int]:
    """A torch workload of about 1 ms (it releases the GIL, like a simulator step)."""
    x = torch.randn(128, 128)
    for _ in range(20):
        x @ x  # warm up
    t = time.perf_counter()
    for _ in range(200):
        x @ x
    per_rep = (time.perf_counter() - t) / 200
    return x, max(1, round(STEP_S / per_rep))


def _loop(
    steps: int,
    syncer: Syncer | None,
    sampler: AdaptiveMotionSampler,
    norm: SyncedEmpiricalNormalization,
    work: tuple[torch.Tensor, int],
    reset_every: int,
    calls: list[float],
) -> float:
    x, reps = work
    g = torch.Generator().manual_seed(0)
    envs = 256
    t0 = time.perf_counter()
    for step in range(steps):
        for _ in range(reps):
            x @ x
        ts = torch.randint(0, sampler.frame_counts[0], (envs,), generator=g)
        sampler.record_failures(ts, torch.rand(envs, generator=g) < 0.02)
        sampler.step()
        norm.update(torch.randn(envs, 64, generator=g))
        if syncer is not None:
            t = time.perf_counter()
            syncer.on_step()
            if step % reset_every == 0:
                syncer.at_reset_boundary()
            calls.append(time.perf_counter() - t)
        if step % reset_every == 0:
            sampler.sample(envs, generator=g)
    return (time.perf_counter() - t0) / steps


def measure_collector_overhead(url: str | None, steps: int = 2000, reset_every: int = 20) -> dict[str, Any]:
    """Per-step wall time of a ~1 ms collector loop with sync off vs on, interleaved in blocks."""
    work = _calibrated_step()
    # the same terms both times: the difference is the syncer alone (its calls and its threads)
    off_terms = (AdaptiveMotionSampler(3000, 0.02, mode="pooled"), SyncedEmpiricalNormalization(64, mode="pooled"))
    on_terms = (AdaptiveMotionSampler(3000, 0.02, mode="pooled"), SyncedEmpiricalNormalization(64, mode="pooled"))
    store = connect(url, run=f"bench-syncer-{uuid.uuid4().hex[:8]}")
    syncer = new_syncer(
        store, 0, list(on_terms), worker="thread", publish_every_steps=50, poll_every_s=0.5
    ).start()  # the sidecar: bench --peers
    off: list[Any] = []
    on: list[Any] = []
    calls: list[Any] = []
    try:
        block = max(steps // 10, 50)
        for _ in range(10):  # alternate, so that machine noise hits both alike
            off.append(_loop(block, None, *off_terms, work, reset_every, []))
            on.append(_loop(block, syncer, *on_terms, work, reset_every, calls))
    finally:
        syncer.stop(flush=False)
        store.delete()
    step_off, step_on = statistics.median(off), statistics.median(on)
    return {
        "step_ms_sync_off": step_off * 1e3,
        "step_ms_sync_on": step_on * 1e3,
        "overhead_pct_of_step": (step_on - step_off) / step_off * 100,
        "syncer_call_us_median": statistics.median(calls) * 1e6,
        "syncer_call_us_p99": sorted(calls)[int(0.99 * len(calls))] * 1e6,
        "publishes": syncer.stats["publishes"],
    }


def measure_rebuild(shapes: tuple[tuple[int, int], ...] = REBUILD_SHAPES, calls: int = 200) -> list[dict[str, Any]]:
    """Per (groups, bins per group): the time to rebuild every group's sampling distribution after
    the EMA moved (kernel sizes 1 and 5), and to draw 4 096 start frames (each env its own group)."""
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out = []
    for device in devices:
        for groups, bins in shapes:
            row: dict[str, Any] = {"device": device, "groups": groups, "bins": bins}
            frames = frames_for_bins(bins) if groups == 1 else [frames_for_bins(bins)] * groups
            for k in (1, 5):
                sampler = AdaptiveMotionSampler(frames, 1 / FPS, mode="local", kernel_size=k, device=device)
                sampler.bin_failed_count.copy_(torch.rand(sampler.bin_count, device=device))
                times = []
                for _ in range(calls):
                    sampler.bin_failed_count.add_(1e-3)  # the EMA moved: the next call rebuilds
                    times.append(_timed(sampler.probabilities, device))
                row[f"rebuild_us_kernel{k}"] = statistics.median(times) * 1e6
            group_ids = None if groups == 1 else torch.randint(0, groups, (4096,), device=device)
            draw = functools.partial(sampler.sample, 4096, group_ids)  # (bound now, not when called)
            times = [_timed(draw, device) for _ in range(calls)]
            row["sample_4096_us"] = statistics.median(times) * 1e6
            out.append(row)
    return out


def _timed(call: Any, device: str) -> float:
    t = time.perf_counter()
    call()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def measure_device_hot_path(
    device: str = "cuda", envs: int = 4096, bins: int = 1000, steps: int = 2000, url: str | None = None
) -> dict[str, Any]:
    """The collector's hot path with its terms on ``device`` (the sampler over ``bins`` bins, a
    normaliser, terrain levels; ``envs`` envs), a publish due every step and the fleet state taken
    at every boundary, beside the same loop with sync off: the host time of a step (what the
    collector's thread spends queuing it; nothing in it waits for the device) and of the syncer's
    calls, p50 and p99; and the device time of one rebuild of the start distribution."""
    from ..terms.torch.curriculum import TerrainLevels

    def terms() -> tuple[AdaptiveMotionSampler, SyncedEmpiricalNormalization, TerrainLevels]:
        return (
            AdaptiveMotionSampler(frames_for_bins(bins), 1 / FPS, mode="pooled", device=device),
            SyncedEmpiricalNormalization(64, mode="pooled").to(device),
            TerrainLevels(envs, 10, mode="pooled", device=device),
        )

    store = connect(url, run=f"bench-device-{uuid.uuid4().hex[:8]}")
    on_terms, off_terms = terms(), terms()
    syncer = new_syncer(store, 0, list(on_terms), worker="thread", publish_every_steps=1).start()
    # a second shard, so that fleet states carry the others' part and the boundary has work to do
    other_terms = terms()
    other = new_syncer(store, 1, list(other_terms), worker="thread", publish_every_steps=1).start()
    frames = on_terms[0].frame_counts[0]

    def step(mine: tuple[Any, ...], sync: Syncer | None, host: list[float], calls: list[float]) -> None:
        sampler, norm, levels = mine
        t0 = time.perf_counter()
        ts = torch.randint(0, frames, (envs,), device=device)
        sampler.record_failures(ts, torch.rand(envs, device=device) < 0.02)
        sampler.step()
        norm.update(torch.randn(envs, 64, device=device))
        ended = torch.arange(0, envs, 50, device=device)
        up = torch.rand(ended.shape[0], device=device) < 0.5
        levels.update(ended, up.long(), (~up).long())
        if sync is not None:
            t = time.perf_counter()
            sync.on_step()
            sync.at_reset_boundary()
            calls.append(time.perf_counter() - t)
        sampler.sample(envs)
        host.append(time.perf_counter() - t0)

    off: list[float] = []
    on: list[float] = []
    calls: list[float] = []
    try:
        for i in range(steps):  # interleaved, so that machine noise hits both alike
            step(off_terms, None, off, [])
            step(on_terms, syncer, on, calls)
            step(other_terms, other, [], [])
            if device == "cuda" and i % 100 == 99:
                torch.cuda.synchronize()  # (between steps: keeps the device from running far behind)
        publishes = syncer.stats["publishes"]
        rebuild = _device_rebuild_us(on_terms[0], device)
    finally:
        for s in (syncer, other):
            s.stop(flush=False)
        store.delete()

    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] * 1e6

    return {
        "device": device,
        "envs": envs,
        "bins": bins,
        "steps": steps,
        "step_us_p50_sync_off": q(off, 0.5),
        "step_us_p99_sync_off": q(off, 0.99),
        "step_us_p50_sync_on": q(on, 0.5),
        "step_us_p99_sync_on": q(on, 0.99),
        "syncer_calls_us_p50": q(calls, 0.5),
        "syncer_calls_us_p99": q(calls, 0.99),
        "rebuild_device_us": rebuild,
        "publishes": publishes,
    }


def _device_rebuild_us(sampler: AdaptiveMotionSampler, device: str, calls: int = 100) -> float:
    """The median device time of one rebuild of the start distribution (CUDA events; on the CPU the wall time)."""
    times = []
    for _ in range(calls):
        sampler.bin_failed_count.add_(1e-3)
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            sampler.probabilities()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            sampler.probabilities()
            times.append((time.perf_counter() - t) * 1e6)
    return float(statistics.median(times))


def format_device_hot_path(r: dict[str, Any]) -> str:
    """The device hot-path figures as a few lines of text."""
    return "\n".join(
        [
            f"collector hot path on {r['device']}: {r['envs']} envs, {r['bins']} bins, a publish every step, "
            f"{r['steps']} steps ({r['publishes']} publishes)",
            f"  host time per step, sync off: p50 {r['step_us_p50_sync_off']:.1f} us, p99 {r['step_us_p99_sync_off']:.1f} us",
            f"  host time per step, sync on:  p50 {r['step_us_p50_sync_on']:.1f} us, p99 {r['step_us_p99_sync_on']:.1f} us",
            f"  on_step() + at_reset_boundary(): p50 {r['syncer_calls_us_p50']:.1f} us, p99 {r['syncer_calls_us_p99']:.1f} us",
            f"  one rebuild of the start distribution: {r['rebuild_device_us']:.1f} us of "
            f"{'device' if r['device'] == 'cuda' else 'wall'} time",
        ]
    )


if __name__ == "__main__":  # scripts/gpu-check runs this
    import sys

    print(format_device_hot_path(measure_device_hot_path(sys.argv[1] if len(sys.argv) > 1 else "cuda")))
