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
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from ..errors import RedisyncError
from ..lifeline import spawn
from ..store.client import Store, connect, masked_url
from ..store.codec import decode, encode
from ..store.library import Library
from ..store.schema import Limits, Schema, merge
from ..store.server import WatchError

SIZES = (64, 1024, 16384)
KEY = "bench/stats"


def _median_us(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _new_run(url: str | None, n: int) -> Store:
    store = connect(url, run=f"bench-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of({KEY: merge(n, lifecycle="history")}), Limits(stream_maxlen=50))
    return store


def _report(rng: np.random.Generator, n: int, k: int) -> dict[str, Any]:
    return {KEY: {"count": float(k), "sum": rng.normal(size=n) * k}}


SHARDS = 4  # live slots of the benchmark's key, all in one group of the fold's sums


def stubbed_publisher(url: str | None, n: int = 64) -> tuple[Callable[[], Any], Callable[[], None]]:
    """``(publish, close)``: a publish of a report in the terms' form (N float64 sums and a float
    count) whose FCALL returns at once with the reply the server gave to the first one, so that it
    costs the client alone (checks, encoding, the arguments, the reply's parsing; not redis-py's own
    path, which a raw FCALL costs too)."""
    store = _new_run(url, n)
    client, rng = store.shard(0), np.random.default_rng(n)
    reply = None

    def call(script: Any, keys: list[str], args: list[Any]) -> Any:
        nonlocal reply
        if script is not store.scripts.fold:  # the claim of an incarnation
            return type(store)._call(store, script, keys, args)
        if reply is None:
            reply = type(store)._call(store, script, keys, args)
        return reply

    store._call = call
    report = _report(rng, n, 1)
    client.publish(report)

    def close() -> None:
        del store._call
        store.delete()

    return (lambda: client.publish(report)), close


def client_publish_us(url: str | None, n: int = 64, calls: int = 1000) -> float:
    """What ``publish()`` costs on the client outside the round trip (see ``stubbed_publisher``):
    the lowest median of five batches (this host's speed moves by up to 2x for seconds at a time; as
    timeit takes the best of its repeats). ``redisync bench --instructions`` counts it in instructions."""
    publish, close = stubbed_publisher(url, n)
    try:
        return min(_median_us(publish, max(1, calls // 5)) for _ in range(5))
    finally:
        close()


# The transport floor: a function that reads nothing and returns at once, called with the same keys
# and arguments as the publish or pull it stands beside (what any FCALL of that request costs).
def floor_library(token: str) -> tuple[str, str, str]:
    """A library of functions that do nothing (the transport floor), named by ``token`` so that
    measurements sharing a server (other runs, other redisync versions) never replace or delete
    each other's: its text, its function and its read-only function."""
    name = f"redisync_floor_{token}"
    text = (
        f"#!lua name={name}\n"
        f"redis.register_function{{function_name = '{name}', callback = function() return 1 end}}\n"
        f"redis.register_function{{function_name = '{name}_ro', callback = function() return 1 end, "
        "flags = {'no-writes'}}\n"
    )
    return text, name, f"{name}_ro"


def _captured(store: Store, call: Callable[[], Any], only: Any = None) -> tuple[list[str], list[Any]]:
    """The keys and arguments ``call`` sends to its function (publish: the fold; pull: the pull);
    with ``only``, those it sends to that function alone (a publish may pay an announcement after)."""
    sent: dict[str, Any] = {}

    def spy(original: Callable[..., Any]) -> Callable[..., Any]:
        def call(script: Any, keys: list[str], args: list[Any]) -> Any:
            if only is None or script is only:
                sent.update(keys=keys, args=list(args))
            return original(script, keys, args)

        return call

    store._call, store._call_read_only = spy(store._call), spy(store._call_read_only)
    try:
        call()
    finally:
        del store._call, store._call_read_only
    return sent["keys"], sent["args"]


def measure_size(url: str | None, n: int, calls: int) -> dict[str, Any]:
    """Median publish and pull latencies, a back-to-back PING series around each, the transport
    floor of each (the same request to a function that does nothing), and the median server time
    of a fold (SLOWLOG), for one key of ``n`` elements with SHARDS live slots. A changed pull is
    timed as a subscribed collector makes it (announced: one call) and as a poll makes it (the
    version read first)."""
    store = _new_run(url, n)
    target = store.server()
    ping = target.ping
    log = target.slow_log(calls)
    try:
        rng = np.random.default_rng(n)
        shards = [store.shard(i) for i in range(SHARDS)]
        reports = [_report(rng, n, k + 1) for k in range(8)]
        for s in shards:  # warm up: scripts loaded, slots exist
            s.publish(reports[0])
        k = iter(range(10**9))

        def publish_one() -> None:
            i = next(k)
            shards[i % SHARDS].publish(reports[i % 8])

        pings = [_median_us(ping, calls)]
        log.reset()
        publish = _median_us(publish_one, calls)
        server = log.median_us("FCALL")
        pings.append(_median_us(ping, calls))
        reader = shards[0]
        reader.pull()
        pull_unchanged = _median_us(reader.pull, calls)  # a poll: one plain read of the version
        pings.append(_median_us(ping, calls))
        changed: list[float] = []
        polled: list[float] = []
        for i in range(min(calls, 1000)):
            shards[1].publish(reports[next(k) % 8])
            t = time.perf_counter()
            reader.pull(check_first=i % 2 == 1)  # announced (one FCALL_RO), or polled (the read, then the call)
            (polled if i % 2 else changed).append(time.perf_counter() - t)
        # the transport floor, in the same run: the same requests to a function that does nothing
        text, floor, floor_ro = floor_library(uuid.uuid4().hex[:12])
        target.client.function_load(text)
        try:
            fold_keys, fold_args = _captured(store, lambda: shards[2].publish(reports[next(k) % 8]))
            shards[1].publish(reports[next(k) % 8])
            pull_keys, pull_args = _captured(store, lambda: reader.pull(check_first=False))
            publish_floor = _median_us(
                lambda: target.client.fcall(floor, len(fold_keys), *fold_keys, *fold_args), calls
            )
            pull_floor = _median_us(
                lambda: target.client.fcall_ro(floor_ro, len(pull_keys), *pull_keys, *pull_args), calls
            )
        finally:
            target.client.function_delete(floor)
        ping_us = statistics.median(pings)
        return {
            "elements": n,
            "payload_values": n + 1,  # one count and the sum vector, float64 each
            "slots": SHARDS,
            "publish_us": publish,
            "publish_over_ping": publish / ping_us,
            "pull_unchanged_us": pull_unchanged,
            "pull_unchanged_over_ping": pull_unchanged / ping_us,
            "pull_changed_us": statistics.median(changed) * 1e6,
            "pull_changed_polled_us": statistics.median(polled) * 1e6,
            "publish_floor_us": publish_floor,
            "publish_over_floor": publish / publish_floor,
            "pull_floor_us": pull_floor,
            "pull_changed_over_floor": statistics.median(changed) * 1e6 / pull_floor,
            "ping_us": ping_us,
            "server_fold_us": server,
        }
    finally:
        log.close()
        store.delete()


# ---------------------------------------------------------------------------- what a fold is made of

# (phase, the line of fold.lua that starts it, indentation aside): the profile marks the server clock before each
PHASES = (
    ("envelope checks", "-- the envelope"),
    ("duplicate check, size, clock", "-- duplicates, retries and zombies"),
    ("restart check (the server's identity)", "server = server_identity()"),
    ("validate and compute", "-- validate and compute every key"),
    ("stream entry (the first write)", "-- apply ---"),
    ("write the state, SPUBLISH", "local versions = {}"),
)


_MARKS = (
    "local __t = {} local function __mark() local t = redis.call('TIME') "
    "__t[#__t + 1] = tonumber(t[1]) * 1000000 + tonumber(t[2]) end"
)


def _profiled_fold() -> str:
    """fold.lua with ``TIME`` read before each phase, returning the readings instead of its reply."""
    from ..store.library import _LUA

    lines, out = _LUA.joinpath("fold.lua").read_text().split("\n"), []
    starts = [start for _, start in PHASES]
    for line in lines:
        code = line.lstrip()
        if code.startswith("KEYS, ARGV = keys, args"):  # the fold's first line: a fresh series per call
            out.append(_MARKS)
        if any(code.startswith(start) for start in starts):
            out.append("__mark()")
        if code.startswith("local reply = {'applied'"):
            out.append("__mark() do return __t end")
        out.append(line)
    return "\n".join(out)


def fold_profile(url: str | None, n: int, calls: int = 200) -> dict[str, float] | None:
    """Median server microseconds per phase of a fold of one merge key of ``n`` values, on the
    benchmark's own workload (SHARDS shards publishing in turn), less the cost of reading the clock.
    None on the embedded store, whose Lua has no server clock worth reading."""
    if url is None:
        return None
    store = _new_run(url, n)
    server = store.server()
    token = uuid.uuid4().hex[:12]  # (a name of this measurement's own: see floor_library)
    profiled = Library(
        server.client, name=f"redisync_profile_{token}", version=f"profile{token}", edit={"fold.lua": _profiled_fold()}
    )
    try:
        rng = np.random.default_rng(n)
        for i in range(SHARDS):
            store.shard(i, incarnation=1).publish(_report(rng, n, 1))
        profiled.load()
        script = profiled.fold
        keys = [
            store.keys.meta,
            store.keys.shards,
            store.keys.reports,
            store.keys.dead_letters,
            store.keys.key_meta(KEY),
            store.keys.key_data(KEY),
        ]
        payloads = [encode([np.concatenate([[float(k + 2)], rng.normal(size=n)])]) for k in range(8)]
        rows = []
        for call in range(calls):
            shard, seq = call % SHARDS, 2 + call // SHARDS
            args = [store.schema.digest, shard, 1, seq, 0, "0", KEY, payloads[call % 8]]
            rows.append(np.diff(script(keys=keys, args=args)))
        clock = server.client.register_script(_MARKS + " __mark() __mark() return __t")
        mark = float(np.median([np.diff(clock())[0] for _ in range(calls)]))
        medians = np.median(rows, axis=0)
        return {name: max(0.0, float(v) - mark) for (name, _), v in zip(PHASES, medians, strict=False)}
    finally:
        profiled.unload()
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
    r, keys = store.server().client, store.keys
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
                    agg_vec = decode(cast(bytes, agg)) if agg else np.zeros(n + 1)
                    folded = (agg_vec - decode(cast(bytes, old))) + new_vec if old else agg_vec + new_vec
                    pipe.multi()
                    pipe.hset(data, mapping={"agg": encode([folded]), f"slot:{shard}": new})
                    pipe.hincrby(meta, "version", 1)
                    pipe.hincrby(keys.meta, "fleet_version", 1)
                    pipe.execute()
                    break
                except WatchError:
                    retries += 1
        done += 1
    out.put((done, retries))


def _run_processes(target: Callable[..., None], args: tuple, procs: int) -> list[Any]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    ps = [spawn(target, *args[:3], i, *args[3:], out) for i in range(procs)]  # each dies with this process
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
    ping = _median_us(store.server().ping, calls)
    sizes = [measure_size(url, n, calls) for n in SIZES]
    conc = measure_concurrency(url, 1024, procs, seconds)
    by_n = {s["elements"]: s for s in sizes}
    small, large = by_n[SIZES[1]], by_n[SIZES[-1]]
    marginal = None
    if small["server_fold_us"] is not None and large["server_fold_us"] is not None:
        # the cost of one more payload value (at SHARDS live slots), free of the fixed per-call cost
        marginal = (
            (large["server_fold_us"] - small["server_fold_us"])
            * 1e3
            / (large["payload_values"] - small["payload_values"])
        )
    client_us = client_publish_us(url, 64, calls)
    limits = {
        "client_publish_us_at_64<=10": 10.0,
        "pull_unchanged_over_ping<=1.15": 1.15,
        f"server_fold_ns_per_value_at_{SHARDS}_slots<=200": 200.0,
    }
    measured = [
        client_us,
        max(s["pull_unchanged_over_ping"] for s in sizes),
        marginal,
    ]
    targets = dict(zip(limits, measured, strict=False))
    result: dict[str, Any] = {
        "url": masked_url(url) if url else "embedded",  # (a password never reaches the output)
        "calls": calls,
        "ping_us": ping,
        "sizes": sizes,
        "server_fold_ns_per_value": marginal,
        "client_publish_us": client_us,
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
