"""``redisync bench --scale``: how one Redis's cost grows with the fleet, and the largest fleet it serves.

- **Slots**: server time of a fold and of a pull against the number of shard slots in a key (8, 64,
  256, 1 024). A fold re-sums its own group of 16 shards and reads the other groups' stored sums, so
  it grows with 16 + n/16 vectors, not with n.
- **Keys per report**: a fold of 1, 16 or 64 keys of 256 values each.
- **Memory**: ``MEMORY USAGE`` of every key of a run, against shards, key size and the reports stream.
- **Throughput**: publishes per second with 8, 32 and 128 publishing connections, and the share of a
  core the Redis process spent (``INFO cpu``) meanwhile.
- **Fleet**: for a stated report (a 1 024-bin sampler and a 256-dim normaliser) at a stated interval,
  the server time one second of the fleet costs, from the measured fold and pull times, and the
  largest fleet that keeps it under a budget of one Redis core.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from typing import Any

import numpy as np

from ..store.client import Store, connect, masked_url
from ..store.schema import Limits, Schema, merge
from ..terms.sampler_options import SAMPLER_KEY
from .core import _run_processes

SLOTS = (8, 64, 256, 1024)
KEYS_PER_REPORT = (1, 16, 64)
CONNECTIONS = (8, 32, 128)
FLEET_SCHEMA = {
    SAMPLER_KEY: merge(1024, lifecycle="history"),
    "obs/norm": merge(256, sumsq=True, lifecycle="history"),
}  # the stated report
CORE_BUDGET = 0.5  # of one Redis core: the rest is headroom for pulls' bursts, CLI reads and persistence
PULLS_PER_FOLD_CAP = 10  # a syncer pulls at most every min_pull_interval_s (0.1 s) whatever the fleet publishes


def _report(schema: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    out = {}
    for name, spec in schema.items():
        r = {"count": float(rng.integers(1, 100)), "sum": rng.normal(size=spec.size)}
        if spec.sumsq:
            r["sumsq"] = rng.random(spec.size) * 10
        out[name] = r
    return out


def _populated(url: str, schema: dict[str, Any], slots: int) -> tuple[Store, list[Any], dict[str, Any]]:
    """A run whose keys hold ``slots`` live shard slots (ids 0..slots-1)."""
    store = connect(url, run=f"bench-scale-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of(schema), Limits(stream_maxlen=100))
    rng = np.random.default_rng(slots)
    report = _report(schema, rng)
    shards = [store.shard(i, incarnation=1) for i in range(slots)]
    for s in shards:
        s.publish(report)
    return store, shards, report


def fold_and_pull(url: str, schema: dict[str, Any], slots: int, calls: int = 100) -> dict[str, float | None]:
    """Server time per fold (from random shards) and per pull of a changed state, in microseconds
    (SLOWLOG medians)."""
    store, shards, report = _populated(url, schema, slots)
    log = store.server().slow_log(calls)
    try:
        rng = np.random.default_rng(0)
        log.reset()
        for _ in range(calls):
            shards[int(rng.integers(slots))].publish(report)
        fold = log.median_us("FCALL")
        reader = shards[0]
        reader.pull()
        pulls = []
        for _ in range(calls):
            shards[int(rng.integers(1, slots))].publish(report)
            log.reset()
            reader.pull()
            pulls.append(log.median_us("FCALL_RO"))  # the pull: the read-only function
        measured = [p for p in pulls if p is not None]  # (a real Redis logs every pull)
        return {"slots": slots, "fold_us": fold, "pull_us": statistics.median(measured) if measured else None}
    finally:
        log.close()
        store.delete()


def memory(url: str, slots: int, elements: int, stream_payloads: bool, reports: int = 1000) -> dict[str, Any]:
    """Bytes Redis holds for a run: one merge key of ``elements`` values, ``slots`` shards, and a
    reports stream after ``reports`` folds (capped at 1 000 entries)."""
    store = connect(url, run=f"bench-mem-{uuid.uuid4().hex[:8]}")
    store.register(
        Schema.of({"bench/key": merge(elements, lifecycle="history")}),
        Limits(stream_maxlen=1000, stream_payloads=stream_payloads),
    )
    try:
        rng = np.random.default_rng(0)
        report = _report({"bench/key": merge(elements, lifecycle="history")}, rng)
        shards = [store.shard(i, incarnation=1) for i in range(slots)]
        for k in range(max(reports, slots)):
            shards[k % slots].publish(report)
        by_key = {}
        for key, used in store.server().memory_by_key(store.keys.pattern).items():
            by_key[key.split(":", 2)[2]] = used
        return {
            "slots": slots,
            "elements": elements,
            "stream_payloads": stream_payloads,
            "bytes_total": sum(by_key.values()),
            "bytes_by_key": by_key,
        }
    finally:
        store.delete()


def _publisher(url: str, run: str, first: int, threads: int, seconds: float, out: Any) -> None:
    """``threads`` connections of one process, each publishing the fleet report as fast as it can."""
    schema = dict(FLEET_SCHEMA)
    counts = [0] * threads

    def loop(k: int) -> None:
        store = connect(url, run=run)
        store.register(Schema.of(schema))
        shard = store.shard(first + k, incarnation=1)
        report = _report(schema, np.random.default_rng(first + k))
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            shard.publish(report)
            counts[k] += 1

    workers = [threading.Thread(target=loop, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out.put(sum(counts))


def throughput(url: str, connections: int, seconds: float = 3.0, processes: int = 8) -> dict[str, Any]:
    """Publishes per second of ``connections`` connections (in up to ``processes`` processes), and the
    share of one core Redis spent meanwhile."""
    run = f"bench-tp-{uuid.uuid4().hex[:8]}"
    store = connect(url, run=run)
    store.register(Schema.of(dict(FLEET_SCHEMA)))
    procs = min(processes, connections)
    per = connections // procs
    try:
        before = store.server().cpu_s()
        t0 = time.monotonic()
        # each process gets shard ids of its own: process i publishes as shards i*per .. i*per+per-1
        done = _run_processes(_scaled_publisher, (url, run, per, seconds), procs)
        wall = time.monotonic() - t0
        cpu = store.server().cpu_s() - before
        return {"connections": procs * per, "publishes_per_s": sum(done) / seconds, "redis_cpu_share": cpu / wall}
    finally:
        store.delete()


def _scaled_publisher(url: str, run: str, per: int, index: int, seconds: float, out: Any) -> None:
    _publisher(url, run, index * per, per, seconds, out)


def fleet_load(rows: list[dict[str, float]], n: float, interval_s: float = 1.0) -> float:
    """Server seconds per second for a fleet of ``n`` collectors publishing the stated report every
    ``interval_s`` and pulling after announcements (at most every 0.1 s): fold and pull times
    interpolated in log n between the measured rows; beyond the last, a fold grows as the vectors it
    reads (16 + n/16)."""
    ns = np.log([r["slots"] for r in rows])
    fold = [r["fold_us"] for r in rows]
    pull = [r["pull_us"] for r in rows]
    last = rows[-1]["slots"]
    if n <= last:
        f, p = float(np.interp(np.log(n), ns, fold)), float(np.interp(np.log(n), ns, pull))
    else:
        f, p = fold[-1] * (16 + n / 16) / (16 + last / 16), pull[-1]
    folds = n / interval_s
    pulls = n * min(PULLS_PER_FOLD_CAP, folds)  # each collector pulls after a fold, at most 10 times a second
    return (folds * f + pulls * p) * 1e-6


def fleet_estimate(rows: list[dict[str, Any]], interval_s: float = 1.0) -> dict[str, Any]:
    """The load at a few fleet sizes, and the largest fleet within `CORE_BUDGET`."""
    table = {n: fleet_load(rows, n, interval_s) for n in (8, 64, 256, 1024, 4096)}
    largest = 1
    while largest < 10**6:
        step = max(1, largest // 100)  # 1 % steps: the estimate is no finer than that
        if fleet_load(rows, largest + step, interval_s) > CORE_BUDGET:
            break
        largest += step
    return {
        "interval_s": interval_s,
        "report": {k: v.model_dump() for k, v in FLEET_SCHEMA.items()},
        "core_budget": CORE_BUDGET,
        "server_s_per_s": table,
        "largest_fleet": largest,
    }


MEMORY_CASES = (
    (8, 1024, False),
    (64, 1024, False),
    (256, 1024, False),
    (8, 64, False),
    (8, 16384, False),
    (8, 1024, True),
)
"""(slots, values, stream payloads) of the memory table."""


def run_scale(
    url: str,
    seconds: float = 3.0,
    slots: tuple[int, ...] = SLOTS,
    keys_per_report: tuple[int, ...] = KEYS_PER_REPORT,
    connections: tuple[int, ...] = CONNECTIONS,
    memory_cases: tuple[tuple[int, int, bool], ...] = MEMORY_CASES,
) -> dict[str, Any]:
    """The scale tables: fold and pull against slots and keys, the stated report against slots, memory,
    throughput against connections, and the largest fleet within `CORE_BUDGET`."""
    by_slots = [fold_and_pull(url, {"bench/key": merge(1024, lifecycle="history")}, n) for n in slots]
    keys = []
    for k in keys_per_report:
        schema = {f"bench/k{i}": merge(256, lifecycle="history") for i in range(k)}
        keys.append({"keys": k, **fold_and_pull(url, schema, 8, calls=50)})
    fleet_rows = [fold_and_pull(url, dict(FLEET_SCHEMA), n) for n in slots]
    mem = [memory(url, s, e, p) for s, e, p in memory_cases]
    tp = [throughput(url, c, seconds) for c in connections]
    return {
        "url": masked_url(url),
        "fold_vs_slots": by_slots,
        "fold_vs_keys": keys,
        "fleet_report_vs_slots": fleet_rows,
        "memory": mem,
        "throughput": tp,
        "fleet": fleet_estimate(fleet_rows),
    }
