"""``redisync bench --churn``: a run's memory follows its live fleet, not every shard id that lived.

A fleet on preemptible machines that gives each new process a fresh shard id passes thousands of ids
through a few live slots. This keeps ``live`` collectors reporting the stated report (a 1 024-value
failure EMA as a state key, a 256-value normaliser with sums of squares as a history key), passes
``ids`` more through the run one after another (each claims, reports, leases and stops), and prints:

- the run's memory (``MEMORY USAGE`` of its hashes and indexes; the reports and dead-letter streams
  are bounded by their own lengths and shown apart) with the live slots alone, at its highest while
  the ids pass (what departed within the graces is still held then), and once the graces have passed;
- the instructions of one fold of the stated report (callgrind, where valgrind is installed) on the
  run before the churn, on the run after it, and on a run of the live collectors alone that reported
  as many samples (the same sums' magnitude, no id passed), each restored into a counting server
  (averaged over ``folds`` folds: Redis steps Lua's collector every 50 scripts). The first against
  the third is what the sums' growth costs a fold; the second against the third what the ids cost;
- that every sample that passed is still counted: the normaliser's pooled count against the count
  reported.
"""

from __future__ import annotations

import shutil
import time
import uuid
from typing import Any

import numpy as np

from ..store.client import Store, connect
from ..store.schema import Limits, Schema, merge
from ..terms.sampler_options import SAMPLER_KEY
from .instructions import CountingServer, _cumulative
from .load import private_server

LIVE_MS = 600_000  # a live collector's lease here: never runs out while the bench runs
STREAMS = ("reports", "dead")


def churn_schema(grace_s: float) -> Schema:
    """The stated report with a grace of ``grace_s``: the EMA a state key, the normaliser a history key."""
    return Schema.of(
        {
            SAMPLER_KEY: merge(1024, lifecycle="state", lease_grace_s=grace_s),
            "obs/norm": merge(256, sumsq=True, lifecycle="history", retire_after_s=grace_s),
        }
    )


def run_memory(store: Store) -> dict[str, int]:
    """The run's bytes: its hashes and indexes, and its streams apart."""
    by_key = store.server().memory_by_key(store.keys.pattern)
    streams = {k: v for k, v in by_key.items() if k.rsplit(":", 1)[-1] in STREAMS}
    return {"state_bytes": sum(by_key.values()) - sum(streams.values()), "stream_bytes": sum(streams.values())}


def _round(store: Store, live: list[Any], last: list[dict[str, Any]], rng: np.random.Generator) -> float:
    """Each live collector reports and renews its lease once; the count its reports added."""
    added = 0.0
    for i, client in enumerate(live):
        report = _cumulative(rng, last[i])
        added += report["obs/norm"]["count"] - last[i]["obs/norm"]["count"]
        client.publish(report)
        store.lease(i, client.incarnation, LIVE_MS)
        last[i] = report
    return added


def churn(url: str, ids: int, live: int, grace_s: float, seed: int = 0) -> dict[str, Any]:
    """``live`` collectors, then ``ids`` more passed through one after another; the run's memory and
    its snapshots before and after (the run is deleted at the end)."""
    store = connect(url, run=f"bench-churn-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    store.register(churn_schema(grace_s), Limits(stream_maxlen=100))
    rng = np.random.default_rng(seed)
    try:
        clients, last = [store.shard(i) for i in range(live)], [_cumulative(rng, None) for _ in range(live)]
        reported = 0.0
        for i, client in enumerate(clients):
            client.publish(last[i])
            store.lease(i, client.incarnation, LIVE_MS)
            reported += last[i]["obs/norm"]["count"]
        before, snap_before = run_memory(store), store.snapshot()
        peak, started = dict(before), time.monotonic()
        for k in range(ids):
            shard_id = live + k
            client = store.shard(shard_id)
            report = _cumulative(rng, None)
            client.publish(report)
            reported += report["obs/norm"]["count"]
            store.lease(shard_id, client.incarnation, 5_000)
            store.lease(shard_id, client.incarnation, 0)
            if k % live == live - 1:  # the live fleet reports and renews between the passing ids
                reported += _round(store, clients, last, rng)
            if k % 500 == 499:
                now = run_memory(store)
                peak = max(peak, now, key=lambda m: m["state_bytes"])
        passed_s = time.monotonic() - started
        time.sleep(2.2 * grace_s)  # past every grace, and the forget horizon (twice the longest grace)
        rounds, ids_left = 0, ids + live
        while rounds < ids and ids_left > live:  # each renewal forgets at most two ids: until none is left
            reported += _round(store, clients, last, rng)
            rounds += 1
            ids_left = len(store.shard_ids())
        after, snap_after = run_memory(store), store.snapshot()
        pooled = float(store.fleet().keys["obs/norm"].parts()["count"])
        meta = store.run_info()
        return {
            "ids": ids,
            "live": live,
            "grace_s": grace_s,
            "ids_per_s": ids / passed_s,
            "memory_live": before,
            "memory_peak": peak,
            "memory_after": after,
            "ratio_after": after["state_bytes"] / before["state_bytes"],
            "rounds_to_forget": rounds,
            "forgotten_ids": int(meta.get("forgotten_ids", "0")),
            "shard_ids_left": ids_left,
            "count_reported": reported,
            "count_pooled": pooled,
            "snapshots": (snap_before, snap_after),
        }
    finally:
        store.delete()


def without_churn(url: str, ids: int, live: int, grace_s: float, seed: int = 0) -> Any:
    """A snapshot of ``live`` collectors alone after as many reports as the churn made (``ids`` more):
    the same samples and sums' magnitude, no shard id passed."""
    store = connect(url, run=f"bench-churn-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    store.register(churn_schema(grace_s), Limits(stream_maxlen=100))
    rng = np.random.default_rng(seed)
    try:
        clients, last = [store.shard(i) for i in range(live)], [_cumulative(rng, None) for _ in range(live)]
        for i, client in enumerate(clients):
            client.publish(last[i])
            store.lease(i, client.incarnation, LIVE_MS)
        for _ in range(-(-ids // live)):
            _round(store, clients, last, rng)
        return store.snapshot()
    finally:
        store.delete()


def fold_instructions(server: CountingServer, snap: Any, live: int, folds: int, seed: int) -> float:
    """Instructions per fold of the stated report by shard 0 of ``snap``'s run, restored on ``server``."""
    store = connect(server.url, run=f"cg-churn-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    try:
        store.restore(snap)
        rng = np.random.default_rng(seed)
        client = store.shard(0, resume=True)  # (its slot taken over, not retired: a fold like every other)
        report = _cumulative(rng, None)
        client.publish(report)  # (the first fold after a restore looks at every writer once)
        reports = []
        for _ in range(folds):
            report = _cumulative(rng, report)
            reports.append(report)
        it = iter(reports)
        return server.count(lambda: client.publish(next(it)), folds)
    finally:
        store.delete()


def run_churn(ids: int = 10_000, live: int = 64, grace_s: float = 2.0, folds: int = 50) -> dict[str, Any]:
    """The churn on a redis-server of its own; the fold's instructions before and after it where
    valgrind is installed (``None`` where it is not)."""
    with private_server() as url:
        result = churn(url, ids, live, grace_s)
        snap_alone = without_churn(url, ids, live, grace_s) if shutil.which("valgrind") else None
    snap_before, snap_after = result.pop("snapshots")
    result["fold_instructions"] = None
    if shutil.which("valgrind") and shutil.which("callgrind_control"):
        server = CountingServer()
        try:
            result["fold_instructions"] = {
                "before": fold_instructions(server, snap_before, live, folds, 1),
                "after": fold_instructions(server, snap_after, live, folds, 1),
                "live_alone_as_many_samples": fold_instructions(server, snap_alone, live, folds, 1),
                "folds": folds,
            }
        finally:
            server.close()
    return result


def format_churn(r: dict[str, Any]) -> str:
    """The churn's figures as lines of text."""
    kib = 1024
    lines = [
        f"churn: {r['ids']} shard ids through {r['live']} live collectors (grace {r['grace_s']:g} s; "
        f"{r['ids_per_s']:.0f} ids/s passed)",
        f"  run memory, {r['live']} live slots alone:     {r['memory_live']['state_bytes'] / kib:9.1f} KiB",
        f"  run memory, highest while ids passed: {r['memory_peak']['state_bytes'] / kib:9.1f} KiB "
        "(the ids gone within the graces still held)",
        f"  run memory, graces passed:            {r['memory_after']['state_bytes'] / kib:9.1f} KiB "
        f"= {r['ratio_after']:.3f} x the live slots' ({r['forgotten_ids']} ids forgotten, "
        f"{r['rounds_to_forget']} rounds of the live fleet)",
        f"  streams (bounded by their lengths):   {r['memory_after']['stream_bytes'] / kib:9.1f} KiB",
        f"  samples counted: {r['count_pooled']:.0f} of {r['count_reported']:.0f} reported",
    ]
    fi = r.get("fold_instructions")
    if fi:
        alone = fi["live_alone_as_many_samples"]
        lines += [
            f"  fold of the stated report (callgrind, {fi['folds']} folds): {fi['before'] / 1e6:.3f} M before, "
            f"{fi['after'] / 1e6:.3f} M after ({fi['after'] / fi['before']:.3f} x)",
            f"    the live collectors alone after as many samples: {alone / 1e6:.3f} M (after the churn "
            f"{fi['after'] / alone:.3f} x it: what the ids cost; it {alone / fi['before']:.3f} x before: what "
            "the sums' growth costs)",
        ]
    else:
        lines.append("  fold instructions: valgrind is not installed here (callgrind counts them)")
    return "\n".join(lines)
