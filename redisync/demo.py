"""``redisync demo``: a small fleet of adaptive frame samplers, with sync off and on.

Each of ``shards`` collectors runs the WBT adaptive sampler's arithmetic (numpy, one bin per
second of motion, α = 0.001, ε = 0.1) on its own envs; its shard sees its own failure rates,
so unsynced CDFs drift apart. With sync on, every collector publishes the EMA of its own
failures to a pooled ``merge`` key and samples from the own-substituted fleet view, so all
shards sample from the same distribution: the one a single unsharded run would use.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass

import numpy as np

from .client import connect
from .schema import Schema, merge

ALPHA, EPSILON = 0.001, 0.1
KEY = "motion/bin_failed"


def sampling_probs(ema: np.ndarray) -> np.ndarray:
    """BeyondMimic's start-frame distribution with kernel size 1: (ema + ε/B), normalised."""
    p = ema + EPSILON / ema.size
    return p / p.sum()


def tv_distance(p: np.ndarray, q: np.ndarray) -> float:
    return 0.5 * float(np.abs(p - q).sum())


def normalised_entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(p.size))


@dataclass
class ShardOutcome:
    shard: int
    tv_from_pooled: float
    entropy: float
    top1_bin: int
    top1_prob: float


@dataclass
class DemoResult:
    sync: bool
    shards: list[ShardOutcome]
    fleet_version: int
    publishes: int
    publish_ms_median: float | None


def run_fleet(
    url: str | None, shards: int, bins: int, envs: int, rounds: int, steps: int, sync: bool, seed: int
) -> DemoResult:
    rng = np.random.default_rng(seed)
    # every bin has its own difficulty; every shard sees its own perturbation profile on top
    difficulty = rng.uniform(0.002, 0.02, bins)
    profile = rng.uniform(0.3, 3.0, (shards, bins))
    fail_p = np.clip(difficulty * profile, 0, 1)
    own_ema = np.zeros((shards, bins))
    view = own_ema.copy()
    store = connect(url, run=f"demo-{uuid.uuid4().hex[:8]}")
    latencies: list[float] = []
    fleet_version = 0
    try:
        store.register(Schema.of({KEY: merge(bins)}))
        clients = [store.shard(s) for s in range(shards)]
        for _ in range(rounds):
            for s in range(shards):
                probs = sampling_probs(view[s])
                for _ in range(steps):  # env steps: each env fails in its current bin with that bin's rate
                    bins_now = rng.choice(bins, size=envs, p=probs)
                    failed = rng.random(envs) < fail_p[s, bins_now]
                    current = np.bincount(bins_now[failed], minlength=bins)
                    own_ema[s] = ALPHA * current + (1 - ALPHA) * own_ema[s]
                view[s] = own_ema[s]
                if sync:  # the reset boundary: publish our own EMA, take the pooled one
                    t = time.perf_counter()
                    clients[s].publish({KEY: {"count": 1.0, "sum": own_ema[s]}})
                    latencies.append(time.perf_counter() - t)
                    clients[s].pull()
                    key = clients[s].known.keys[KEY]
                    view[s] = key.view({"count": 1.0, "sum": own_ema[s]})["sum"]
        if sync:
            fleet_version = store.fleet().fleet_version
    finally:
        store.delete()
    pooled = sampling_probs(own_ema.sum(axis=0))  # what one unsharded run of all envs would sample
    outcomes = []
    for s in range(shards):
        p = sampling_probs(view[s])
        outcomes.append(
            ShardOutcome(s, tv_distance(p, pooled), normalised_entropy(p), int(p.argmax()), float(p.max()))
        )
    median = statistics.median(latencies) * 1e3 if latencies else None
    return DemoResult(sync, outcomes, fleet_version, len(latencies), median)
