"""``redisync bench``: latency, server time and throughput of publish and pull, measured side by side.

Every figure comes from one run against one server, so ratios (publish vs PING, Lua fold vs a
client-side WATCH/MULTI fold) compare like with like on a noisy shared machine.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import statistics
import time
import uuid
from typing import Any, Callable

import numpy as np
import redis

from ..errors import RedisyncError
from ..store.client import Store, connect
from ..store.codec import decode, encode
from ..store.schema import Limits, Schema, merge

SIZES = (64, 1024, 16384)
KEY = "bench/stats"


def _median_us(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _paired_us(
    fn: Callable[[], Any], ping: Callable[[], Any], calls: int, before: Callable[[], Any] | None = None
) -> tuple[float, float]:
    """Medians of ``fn`` and of a PING timed right before each call: a ratio immune to machine drift."""
    op, base = [], []
    for _ in range(calls):
        if before is not None:
            before()
        t0 = time.perf_counter()
        ping()
        t1 = time.perf_counter()
        fn()
        t2 = time.perf_counter()
        base.append(t1 - t0)
        op.append(t2 - t1)
    return statistics.median(op) * 1e6, statistics.median(base) * 1e6


def _server_us_per_call(store: Store) -> float | None:
    """Mean server time of EVALSHA since the last CONFIG RESETSTAT (None where INFO has no commandstats)."""
    try:
        stats = store.redis.info("commandstats")
    except redis.ResponseError:
        return None
    entry = stats.get("cmdstat_evalsha")
    return float(entry["usec_per_call"]) if entry else None


def _reset_stats(store: Store) -> bool:
    try:
        store.redis.config_resetstat()
        return True
    except redis.ResponseError:
        return False


def _new_run(url: str | None, n: int) -> Store:
    store = connect(url, run=f"bench-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({KEY: merge(n, lifecycle="history")}), Limits(stream_maxlen=50))
    return store


def _report(rng: np.random.Generator, n: int, k: int) -> dict[str, Any]:
    return {KEY: {"count": float(k), "sum": rng.normal(size=n) * k}}


def measure_size(url: str | None, n: int, calls: int) -> dict[str, Any]:
    """Median publish and pull latencies (each beside its own PING) and server fold time for one key of ``n`` elements."""
    store = _new_run(url, n)
    ping = store.redis.ping
    try:
        rng = np.random.default_rng(n)
        shards = [store.shard(i) for i in range(4)]
        reports = [_report(rng, n, k + 1) for k in range(8)]
        for s in shards:  # warm up: scripts loaded, slots exist
            s.publish(reports[0])
        k = iter(range(10**9))

        def publish_one() -> None:
            i = next(k)
            shards[i % 4].publish(reports[i % 8])

        has_stats = _reset_stats(store)
        publish, ping_publish = _paired_us(publish_one, ping, calls)
        server = _server_us_per_call(store) if has_stats else None
        reader = shards[0]
        reader.pull()
        pull_unchanged, ping_unchanged = _paired_us(reader.pull, ping, calls)
        pull_changed, ping_changed = _paired_us(
            reader.pull, ping, min(calls, 1000), before=lambda: shards[1].publish(reports[next(k) % 8])
        )
        payload = n + 1  # one count and the sum vector, float64 each
        return {
            "elements": n,
            "payload_values": payload,
            "publish_us": publish,
            "publish_over_ping": publish / ping_publish,
            "pull_unchanged_us": pull_unchanged,
            "pull_unchanged_over_ping": pull_unchanged / ping_unchanged,
            "pull_changed_us": pull_changed,
            "ping_us": statistics.median([ping_publish, ping_unchanged, ping_changed]),
            "server_fold_us": server,
            "server_ns_per_payload_value": None if server is None else server * 1e3 / payload,
        }
    finally:
        store.delete()


# ---------------------------------------------------------------------------- what a fold is made of

# (phase, the line of fold.lua that starts it): the profile marks the server clock before each
PHASES = (
    ("envelope checks", "-- the envelope"),
    ("duplicate check, size, clock", "-- duplicates, retries and zombies"),
    ("restart check (INFO server)", "local info = redis.pcall('INFO', 'server')"),
    ("validate and compute", "-- validate and compute every key"),
    ("write the state", "-- apply ---"),
    ("stream entry and PUBLISH", "redis.call(unpack(entry))"),
)


def _profiled_fold() -> str:
    """fold.lua with ``TIME`` read before each phase, returning the readings instead of its reply."""
    from ..store.client import _LUA

    lines, out = _LUA.joinpath("fold.lua").read_text().split("\n"), []
    out.append(
        "local __t = {} local function __mark() local t = redis.call('TIME') "
        "__t[#__t + 1] = tonumber(t[1]) * 1000000 + tonumber(t[2]) end"
    )
    starts = [start for _, start in PHASES]
    for line in lines:
        if any(line.startswith(start) for start in starts):
            out.append("__mark()")
        if line.startswith("local reply = {'applied'"):
            out.append("__mark() do return __t end")
        out.append(line)
    return "\n".join(out)


def fold_profile(url: str | None, n: int, calls: int = 200) -> dict[str, float] | None:
    """Median server microseconds per phase of a fold of one merge key of ``n`` values (1 shard).
    None on the embedded store, whose Lua has no server clock worth reading."""
    if url is None:
        return None
    store = _new_run(url, n)
    try:
        shard = store.shard(0, incarnation=1)
        shard.publish(_report(np.random.default_rng(0), n, 1))
        script = store.redis.register_script(_profiled_fold())
        keys = [
            store.keys.meta,
            store.keys.shards,
            store.keys.reports,
            store.keys.dead_letters,
            store.keys.key_meta(KEY),
            store.keys.key_data(KEY),
        ]
        payload = encode([np.concatenate([[1.0], np.ones(n)])])
        rows = [
            np.diff(script(keys=keys, args=[store.schema.digest, 0, 1, seq, 0, "0", KEY, payload]))
            for seq in range(2, calls + 2)
        ]
        medians = np.median(rows, axis=0)
        return {name: float(v) for (name, _), v in zip(PHASES, medians)}
    finally:
        store.delete()


# ---------------------------------------------------------------------------- concurrency


def _lua_publisher(url: str | None, run: str, n: int, shard: int, seconds: float, out: Any) -> None:
    store = connect(url, run=run)
    store.register(Schema.of({KEY: merge(n, lifecycle="history")}), Limits(stream_maxlen=50))
    client = store.shard(shard)
    rng = np.random.default_rng(shard)
    report = _report(rng, n, 1)
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        client.publish(report)
        done += 1
    out.put(done)


def _watch_publisher(url: str, run: str, n: int, shard: int, seconds: float, out: Any) -> None:
    """The obvious alternative: read the aggregate and own slot, fold in numpy, write back under WATCH."""
    store = connect(url, run=run)
    r, keys = store.redis, store.keys
    data, meta = keys.key_data(KEY), keys.key_meta(KEY)
    new = encode([np.ones(1), np.random.default_rng(shard).normal(size=n)])
    new_vec = decode(new)
    done, retries, end = 0, 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        with r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(data)
                    agg, old = pipe.hmget(data, "agg", f"slot:{shard}")
                    agg_vec = decode(agg) if agg else np.zeros(n + 1)
                    folded = (agg_vec - decode(old)) + new_vec if old else agg_vec + new_vec
                    pipe.multi()
                    pipe.hset(data, mapping={"agg": encode([folded]), f"slot:{shard}": new})
                    pipe.hincrby(meta, "version", 1)
                    pipe.hincrby(keys.meta, "fleet_version", 1)
                    pipe.execute()
                    break
                except redis.WatchError:
                    retries += 1
        done += 1
    out.put((done, retries))


def _run_processes(target: Callable[..., None], args: tuple, procs: int) -> list[Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ps = [ctx.Process(target=target, args=(*args[:3], i, *args[3:], out)) for i in range(procs)]
    for p in ps:
        p.start()
    results = []
    for _ in ps:
        try:
            results.append(out.get(timeout=60 + 2 * float(args[-1])))
        except queue.Empty:
            break
    for p in ps:
        p.join(timeout=10)
    failed = [p.exitcode for p in ps if p.exitcode != 0]
    if failed or len(results) < procs:
        raise RedisyncError(
            f"{len(failed) or procs - len(results)} of {procs} publisher processes failed (exit codes {failed})"
        )
    return results


def measure_concurrency(url: str | None, n: int, procs: int, seconds: float) -> dict[str, Any] | None:
    """Publishes per second of ``procs`` processes on one key: the Lua fold vs WATCH/MULTI.

    None for the embedded store: every process would have a store of its own.
    """
    if url is None:
        return None
    run = f"bench-c-{uuid.uuid4().hex[:8]}"
    try:
        lua = sum(_run_processes(_lua_publisher, (url, run, n, seconds), procs)) / seconds
    finally:
        connect(url, run=run).delete()
    run = f"bench-w-{uuid.uuid4().hex[:8]}"
    try:
        connect(url, run=run).register(Schema.of({KEY: merge(n, lifecycle="history")}))
        rows = _run_processes(_watch_publisher, (url, run, n, seconds), procs)
    finally:
        connect(url, run=run).delete()
    watch = sum(d for d, _ in rows) / seconds
    return {
        "processes": procs,
        "elements": n,
        "lua_publishes_per_s": lua,
        "watch_publishes_per_s": watch,
        "watch_retries": sum(r for _, r in rows),
        "lua_over_watch": lua / watch if watch else None,
    }


def run_all(url: str | None, calls: int = 1000, procs: int = 8, seconds: float = 3.0) -> dict[str, Any]:
    store = connect(url, run="bench-ping")
    ping = _median_us(store.redis.ping, calls)
    sizes = [measure_size(url, n, calls) for n in SIZES]
    conc = measure_concurrency(url, 1024, procs, seconds)
    by_n = {s["elements"]: s for s in sizes}
    small, large = by_n[SIZES[1]], by_n[SIZES[-1]]
    marginal = None
    if small["server_fold_us"] is not None and large["server_fold_us"] is not None:
        # the cost of one more payload value, free of the fixed per-call cost that dominates small N
        marginal = (
            (large["server_fold_us"] - small["server_fold_us"])
            * 1e3
            / (large["payload_values"] - small["payload_values"])
        )
    targets = {
        "publish_64_over_ping<=1.5": by_n[64]["publish_over_ping"],
        "publish_1024_over_ping<=2.5": by_n[1024]["publish_over_ping"],
        "pull_unchanged_over_ping<=1.3": max(s["pull_unchanged_over_ping"] for s in sizes),
        "server_fold_ns_per_value<=200": marginal,
    }
    limits = {
        "publish_64_over_ping<=1.5": 1.5,
        "publish_1024_over_ping<=2.5": 2.5,
        "pull_unchanged_over_ping<=1.3": 1.3,
        "server_fold_ns_per_value<=200": 200.0,
    }
    result: dict[str, Any] = {
        "url": url or "embedded",
        "calls": calls,
        "ping_us": ping,
        "sizes": sizes,
        "concurrency": conc,
        "fold_profile_us": {n: fold_profile(url, n) for n in (64, 1024)},
    }
    try:
        from .terms import measure_collector_overhead, measure_rebuild
    except ImportError:  # torch is an optional dependency
        result["collector"] = None
    else:
        result["collector"] = measure_collector_overhead(url, steps=max(calls, 500))
        result["rebuild"] = measure_rebuild(calls=min(calls, 200))
        targets["syncer_overhead_pct_of_1ms_step<=2"] = result["collector"]["overhead_pct_of_step"]
        limits["syncer_overhead_pct_of_1ms_step<=2"] = 2.0
    result["targets"] = {
        k: {"measured": v, "limit": limits[k], "met": None if v is None else v <= limits[k]} for k, v in targets.items()
    }
    return result
