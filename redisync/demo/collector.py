"""One collector process of ``redisync demo``: adaptive motion sampling on a motion whose bins
differ in difficulty, with failure rates of its own shard, synced (or not) through the store."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..collector.workers import new_syncer
from ..store.client import connect
from ..terms.torch.sampler import FPS, AdaptiveMotionSampler, frames_for_bins


@dataclass(frozen=True)
class FleetConfig:
    shards: int = 4
    envs: int = 1024
    steps: int = 15000
    bins: int = 20
    seed: int = 0
    snapshot_every: int = 200

    @property
    def num_frames(self) -> int:
        return frames_for_bins(self.bins)

    def failure_rates(self) -> np.ndarray:
        """Per env step, the probability to fall in each bin, per shard: shared difficulty × own profile.

        Some bins are hard for everybody (fast segments); each shard also has pushes of its own in a
        few bins (as when collectors load different perturbations), so unsynced CDFs drift apart.
        """
        rng = np.random.default_rng(self.seed)
        base = 0.001 + 0.01 * rng.random(self.bins) ** 3
        profile = np.ones((self.shards, self.bins))
        for s in range(self.shards):
            profile[s, rng.choice(self.bins, size=max(1, self.bins // 6), replace=False)] = 8.0
        return np.clip(base * profile, 0.0, 1.0)


class LogToParent(logging.Handler):
    """redisync's log records of a collector process, sent to the demo's process as ``("log", shard,
    line)``: it prints them on lines of their own above the progress bar (written straight to
    stderr from here, they were glued onto the bar)."""

    def __init__(self, out: Any, shard: int):
        super().__init__(logging.INFO)
        self.out, self.shard = out, shard

    def emit(self, record: logging.LogRecord) -> None:
        self.out.put(("log", self.shard, f"collector {self.shard}: {record.levelname.lower()}: {record.getMessage()}"))


def run_collector(
    url: str, run: str, shard: int, cfg: FleetConfig, sync: bool, out: Any, go: Any, end: Any = None
) -> None:
    """Step this shard's envs; report progress, periodic snapshots and a summary on ``out``.

    Every collector says it is ready, then waits for ``go``, so that the fleet starts together; and
    stops once every collector has stepped (``end``, a barrier): a stopped collector gives its lease up
    and leaves the fleet's failure EMA, which the last snapshots of the others would show.
    """
    logger = logging.getLogger("redisync")
    logger.addHandler(LogToParent(out, shard))
    logger.propagate = False
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(cfg.seed * 1000 + shard)
    rates = torch.as_tensor(cfg.failure_rates()[shard], dtype=torch.float32)
    sampler = AdaptiveMotionSampler(cfg.num_frames, 1 / FPS, mode="pooled" if sync else "local", shard_id=shard)
    assert sampler.bin_count == cfg.bins
    syncer = None
    if sync:
        syncer = new_syncer(
            connect(url, run=run), shard, [sampler], publish_every_steps=25, poll_every_s=0.5, min_pull_interval_s=0.05
        ).start()
    try:
        time_steps = sampler.sample(cfg.envs, generator=g)
        out.put(("ready", shard, None))
        go.wait(120)
        t0 = time.perf_counter()
        for step in range(1, cfg.steps + 1):
            time_steps += 1
            failed = torch.rand(cfg.envs, generator=g) < rates[sampler.bin_of(time_steps)]
            done = failed | (time_steps >= cfg.num_frames)
            sampler.record_failures(time_steps[done], failed[done])
            sampler.step()
            if syncer is not None:
                syncer.on_step()
            if bool(done.any()):
                if syncer is not None:
                    syncer.at_reset_boundary()
                time_steps[done] = sampler.sample(int(done.sum()), generator=g)
            if step % cfg.snapshot_every == 0:
                out.put(
                    (
                        "snapshot",
                        shard,
                        step,
                        sampler.bin_failed_count.double().numpy().copy(),
                        sampler.probabilities().double().numpy().copy(),
                    )
                )
                out.put(("progress", shard, cfg.snapshot_every))
    except BaseException:  # its parent died (ParentExited) or the shard failed: stop as at the end
        if syncer is not None:
            syncer.stop()  # the last report published if the store answers, the lease given up
        raise
    if end is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            end.wait(600)
    published = syncer.stop() if syncer is not None else True  # the last report: did it reach the store?
    metrics = syncer.metrics() if syncer is not None else {}  # (after stop(): the last publish counted)
    summary = {"seconds": time.perf_counter() - t0, "last_report_published": float(published)}
    out.put(("done", shard, {**summary, **sampler.metrics(), **metrics}))
