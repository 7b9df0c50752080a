"""``redisync bench --instructions``: what a fold costs the server, in instructions.

Wall-clock figures on a shared 2-core machine move with its load; the instructions a request costs
do not. This runs a ``redis-server`` of its own under valgrind's callgrind, counting only while the
server reads, parses and executes a request (``readQueryFromClient`` and what it calls), and reports
per fold of one merge key: instructions at each payload size and live slot count, the floors beside
them (a PING, an HSET of the same payload, one struct decode and encode of it in Lua), and the
marginal cost per value at each slot count (the difference between the two largest sizes, divided
by their difference in values), which is the figure fold targets are set on.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import redis_server
from ..errors import RedisyncError
from ..lifeline import popen
from ..store.client import Store, connect
from ..store.schema import Schema, merge

SIZES = (64, 1024, 16384)
SLOTS = (1, 4, 16, 64)
KEY = "bench/stats"
DECODE_ENCODE = "local v = {struct.unpack(ARGV[2], ARGV[1])}; v[#v] = nil; return #struct.pack(ARGV[2], unpack(v))"


class CountingServer:
    """A redis-server under callgrind, counting instructions only inside request handling."""

    def __init__(self) -> None:
        missing = [tool for tool in ("valgrind", "callgrind_control", "redis-server") if shutil.which(tool) is None]
        if missing:
            raise RedisyncError(
                f"bench --instructions needs {', '.join(missing)} on PATH (valgrind's callgrind counts "
                "the server's instructions)"
            )
        self.dir = Path(tempfile.mkdtemp(prefix="redisync-callgrind-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.process = popen(  # SIGTERMed when this process dies: no valgrind left counting
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=readQueryFromClient",
                f"--callgrind-out-file={self.dir}/cg.%p",
                *redis_server.command(self.port, self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 120
        while True:
            try:
                connect(self.url, run="probe").ping()
                break
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.close()
                    raise RedisyncError("redis-server under valgrind did not answer within 120 s") from None
                time.sleep(0.5)

    def count(self, fn: Callable[[], Any], times: int) -> float:
        """Instructions per call of ``fn`` (which sends one request), over ``times`` calls."""
        pid = str(self.process.pid)
        subprocess.run(["callgrind_control", "--zero", pid], check=True, capture_output=True)
        for _ in range(times):
            fn()
        before = set(glob.glob(f"{self.dir}/cg.{pid}.*"))
        subprocess.run(["callgrind_control", "--dump", pid], check=True, capture_output=True)
        for _ in range(100):
            new = set(glob.glob(f"{self.dir}/cg.{pid}.*")) - before
            if new:
                path = new.pop()
                for _ in range(50):
                    text = Path(path).read_text()
                    found = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
                    if found:
                        os.unlink(path)
                        return int(found.group(1)) / times
                    time.sleep(0.1)
            time.sleep(0.1)
        raise RedisyncError("callgrind wrote no dump")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def measure(server: CountingServer, n: int, slots: int, folds: int) -> float:
    """Instructions per fold of one merge key of ``n`` values with ``slots`` live slots."""
    store = connect(server.url, run=f"cg-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    try:
        store.register(Schema.of({KEY: merge(n, lifecycle="history")}))
        rng = np.random.default_rng(n + slots)
        shards = [store.shard(i) for i in range(slots)]
        for shard in shards:  # every slot live; the scripts loaded
            shard.publish({KEY: {"count": 1.0, "sum": rng.random(n)}})
        reports = [{KEY: {"count": float(k + 2), "sum": rng.random(n)}} for k in range(folds)]
        it = iter(reports)
        return server.count(lambda: shards[0].publish(next(it)), folds)
    finally:
        store.delete()


def floors(server: CountingServer, n: int, times: int) -> dict[str, float]:
    """What a request of the same payload costs without the fold: PING, HSET, one decode and encode."""
    r = connect(server.url, run="floors", socket_timeout=600).server().client
    payload = np.random.default_rng(n).random(n + 1).tobytes()
    fmt = "<" + "d" * (n + 1)
    sha = r.script_load(DECODE_ENCODE)
    out = {"ping": server.count(r.ping, times), "hset": server.count(lambda: r.hset("floors:h", "f", payload), times)}
    if n + 1 <= 7900:  # Lua's unpack takes at most ~8000 values
        out["decode_encode"] = server.count(lambda: r.evalsha(sha, 0, payload, fmt), times)
    r.delete("floors:h")
    return out


def client_instructions(publishes: int = 1000) -> float:
    """Instructions per ``publish()`` on the client outside the round trip, at 64 values: the
    difference between ``client_probe`` runs of ``publishes`` and of 0 publishes under callgrind
    (each counts from its zero to its dump, the dump's own start included in both)."""
    out = Path(tempfile.mkdtemp(prefix="redisync-callgrind-client-"))
    try:
        totals = []
        for count in (publishes, 0):
            subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.{count}.%p", sys.executable,
                 "-m", "redisync.bench.client_probe", str(count)],
                check=True, capture_output=True, env={**os.environ, "PYTHONHASHSEED": "0"},
            )  # fmt: skip
            dumps = sorted(glob.glob(f"{out}/cg.{count}.*.1"))
            if not dumps:
                raise RedisyncError("callgrind wrote no dump of the client probe")
            found = re.search(r"^(?:summary|totals): (\d+)", Path(dumps[0]).read_text(), re.M)
            totals.append(int(found.group(1)) if found else 0)
        return (totals[0] - totals[1]) / publishes
    finally:
        shutil.rmtree(out, ignore_errors=True)


def folds_for(n: int) -> int:
    """Folds to average at ``n`` values: a whole number of Redis' garbage-collector periods (it steps
    Lua's collector once every 50 scripts), so that every count holds the same share of steps. (With
    6 folds at 1 024 values, whether a step landed among them moved the count by a tenth.)"""
    return 50 * max(1, 6400 // n // 50)


def run_instructions(
    sizes: tuple[int, ...] = SIZES,
    slots: tuple[int, ...] = SLOTS,
    folds: int | None = None,
    client_publishes: int = 1000,
) -> dict[str, Any]:
    """The instruction table: per fold, per size and slot count; the floors; the marginal cost per
    value; the client's instructions per publish at 64 values."""
    server = CountingServer()
    try:
        rows = [
            {"values": n, "slots": s, "instructions": measure(server, n, s, folds or folds_for(n))}
            for n in sizes
            for s in slots
        ]
        floor_rows = [{"values": n, **floors(server, n, folds or folds_for(n))} for n in sizes]
    finally:
        server.close()
    client = client_instructions(client_publishes)
    marginal = []
    if len(sizes) >= 2:
        small, large = sorted(sizes)[-2:]
        for s in slots:
            a = next(r["instructions"] for r in rows if r["values"] == small and r["slots"] == s)
            b = next(r["instructions"] for r in rows if r["values"] == large and r["slots"] == s)
            marginal.append({"slots": s, "per_value": (b - a) / (large - small)})
    return {
        "folds": rows,
        "floors": floor_rows,
        "marginal_per_value": marginal,
        "sizes": list(sizes),
        "slots": list(slots),
        "client_publish_instructions_at_64": client,
    }


def format_table(result: dict[str, Any]) -> str:
    """The table as printed by the CLI."""
    lines = [
        "instructions per fold (server: read, parse, execute; callgrind)",
        "values  " + "".join(f"{f'{s} slot' + ('s' if s > 1 else ''):>14}" for s in result["slots"]),
    ]
    for n in result["sizes"]:
        cells = [
            next(r["instructions"] for r in result["folds"] if r["values"] == n and r["slots"] == s)
            for s in result["slots"]
        ]
        lines.append(f"{n:<8}" + "".join(f"{c:>14,.0f}" for c in cells))
    if result["marginal_per_value"]:
        lines.append(
            "marginal"
            + "".join(f"{m['per_value']:>14,.0f}" for m in result["marginal_per_value"])
            + "   per value, between the two largest sizes"
        )
    lines.append(
        f"client: {result['client_publish_instructions_at_64']:,.0f} per publish() at 64 values, outside the round trip"
    )
    lines.append(
        "floors: "
        + "; ".join(
            f"{f['values']} values: PING {f['ping']:,.0f}, HSET {f['hset']:,.0f}"
            + (f", decode+encode {f['decode_encode']:,.0f}" if "decode_encode" in f else "")
            for f in result["floors"]
        )
    )
    return "\n".join(lines)


FLEET_SLOTS = (4, 64, 1024)


def _fleet_schema(lifecycle: str) -> Schema:
    """The stated report (`FLEET_SCHEMA`: a 1 024-value key and a 256-value key with sums of squares)
    as history or state keys."""
    from .scale import FLEET_SCHEMA

    return Schema.of({name: spec.model_copy(update={"lifecycle": lifecycle}) for name, spec in FLEET_SCHEMA.items()})


def _cumulative(rng: np.random.Generator, previous: dict[str, Any] | None) -> dict[str, Any]:
    """A collector's next cumulative report of `FLEET_SCHEMA`: its previous one plus what it saw since
    (real values, not whole numbers: the sums carry every bit of a float)."""
    from .scale import FLEET_SCHEMA

    sampler, norm = FLEET_SCHEMA  # (the 1 024-value key, the 256-value key with sums of squares)
    n, m = FLEET_SCHEMA[sampler].size, FLEET_SCHEMA[norm].size
    if previous is None:
        previous = {
            sampler: {"count": 0.0, "sum": np.zeros(n)},
            norm: {"count": 0.0, "sum": np.zeros(m), "sumsq": np.zeros(m)},
        }
    seen = rng.random(m) - 0.5
    return {
        sampler: {"count": previous[sampler]["count"] + 64.0, "sum": previous[sampler]["sum"] + rng.random(n) * 0.02},
        norm: {
            "count": previous[norm]["count"] + 64.0,
            "sum": previous[norm]["sum"] + seen * 64,
            "sumsq": previous[norm]["sumsq"] + seen * seen * 64,
        },
    }


def _fleet_run(url: str, lifecycle: str, slots: int, seed: int) -> tuple[Store, list[Any], list[dict[str, Any]]]:
    store = connect(url, run=f"cg-fleet-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    store.register(_fleet_schema(lifecycle))
    rng = np.random.default_rng(seed)
    shards = [store.shard(i) for i in range(slots)]
    last = []
    for shard in shards:  # every slot live
        report = _cumulative(rng, None)
        shard.publish(report)
        last.append(report)
    return store, shards, last


def fleet_costs(server: CountingServer, lifecycle: str, slots: int, folds: int) -> dict[str, float]:
    """Instructions per fold of the stated report by shard 0 with ``slots`` live slots, and per pull
    by shard 0 of the state another shard's fold changed."""
    store, shards, last = _fleet_run(server.url, lifecycle, slots, slots)
    rng = np.random.default_rng(slots + 1)
    try:
        reports = []
        for _ in range(folds):
            last[0] = _cumulative(rng, last[0])
            reports.append(last[0])
        it = iter(reports)
        fold = server.count(lambda: shards[0].publish(next(it)), folds)
        shards[0].pull()
        pulls = []
        for _ in range(10):
            last[1] = _cumulative(rng, last[1])
            shards[1].publish(last[1])
            pulls.append(server.count(shards[0].pull, 1))
        return {"fold": fold, "pull": float(np.mean(pulls))}
    finally:
        store.delete()


def floor_costs(server: CountingServer, folds: int) -> dict[str, float]:
    """Instructions per call of the two reference folds (`redisync.bench.floors`) on the stated
    report's payloads, the same cumulative reports the fold is counted on."""
    from .floors import FLOOR_ADD, PLAIN_FOLD, payloads

    r = connect(server.url, run="floors", socket_timeout=600).server().client
    keys = [f"floors:{uuid.uuid4().hex[:8]}:{i}" for i in range(2)]
    rng, last, reports = np.random.default_rng(2), None, []
    for _ in range(2 * folds + 2):
        last = _cumulative(rng, last)
        reports.append(payloads(last))
    add, plain = r.script_load(FLOOR_ADD), r.script_load(PLAIN_FOLD)
    it = iter(reports)
    try:
        r.evalsha(add, 2, *keys, *next(it))  # (the stored sum exists: every counted call reads one)
        added = server.count(lambda: r.evalsha(add, 2, *keys, *next(it)), folds)
        r.delete(*keys)
        r.evalsha(plain, 2, *keys, "slot:0", *next(it))
        folded = server.count(lambda: r.evalsha(plain, 2, *keys, "slot:0", *next(it)), folds)
    finally:
        r.delete(*keys)
    return {"floor_add": added, "plain_fold": folded}


def instructions_per_cpu_second(folds: int = 400) -> float:
    """This machine's instructions per second of a redis-server's CPU on the folds: the stated report
    folded at 64 live slots on a redis-server of its own, not under valgrind (``INFO cpu`` around the
    folds), against callgrind's count of the same folds. (On a loaded machine a core shared with
    other work runs fewer instructions a second: the figure says what this run saw.)"""
    from .load import private_server

    rng = np.random.default_rng(64)
    with private_server() as url:
        store, shards, last = _fleet_run(url, "history", 64, 64)
        reports = []
        for _ in range(folds):
            last[0] = _cumulative(rng, last[0])
            reports.append(last[0])
        before = store.server().cpu_s()
        for report in reports:
            shards[0].publish(report)
        cpu = (store.server().cpu_s() - before) / folds
        store.delete()
    server = CountingServer()
    try:
        counted = fleet_costs(server, "history", 64, min(folds, 50))["fold"]
    finally:
        server.close()
    return counted / cpu


def run_fleet_instructions(
    slots: tuple[int, ...] = FLEET_SLOTS, folds: int = 50, rate_folds: int = 400, value_slots: tuple[int, ...] = (4, 64)
) -> dict[str, Any]:
    """The stated report's fold and pull at each number of live slots, as history and as state keys;
    the marginal cost per value at 4 and 64 slots (one key, 64 against 1 024 values); the capacity
    per primary from the instructions (`CORE_BUDGET` of a core at this machine's rate)."""
    from .scale import CORE_BUDGET

    server = CountingServer()
    try:
        rows: list[dict[str, Any]] = [
            {"lifecycle": lc, "slots": s, **fleet_costs(server, lc, s, folds)}
            for lc in ("history", "state")
            for s in slots
        ]
        marginal = []
        for s in value_slots:
            a, b = measure(server, 64, s, 2 * folds), measure(server, 1024, s, folds)
            marginal.append({"slots": s, "per_value": (b - a) / (1024 - 64), "fold_64_values": a})
        reference = floor_costs(server, folds)
    finally:
        server.close()
    rate = instructions_per_cpu_second(rate_folds)
    for row in rows:
        row["collectors_at_1hz"] = CORE_BUDGET * rate / (row["fold"] + row["pull"])
        row["over_floor_add"] = row["fold"] / reference["floor_add"]
        row["over_plain_fold"] = row["fold"] / reference["plain_fold"]
    return {
        "rows": rows,
        "marginal": marginal,
        "floors": reference,
        "rate": rate,
        "core_budget": CORE_BUDGET,
        "folds": folds,
    }


def format_fleet_table(r: dict[str, Any]) -> str:
    """The fleet table as printed by the CLI."""
    lines = [
        "the stated report (1 024 values + 256 with sums of squares, cumulative real values), folded by one shard",
        "keys      live slots   fold (instructions)   pull   collectors at 1 Hz within "
        f"{r['core_budget']:.1f} core (from instructions)",
    ]
    for row in r["rows"]:
        lines.append(
            f"{row['lifecycle']:<9} {row['slots']:>10} {row['fold']:>21,.0f} {row['pull']:>6,.0f} "
            f"{row['collectors_at_1hz']:>10,.0f}"
        )
    for lc in ("history", "state"):
        cells = {row["slots"]: row["fold"] for row in r["rows"] if row["lifecycle"] == lc}
        if 64 in cells and 1024 in cells:
            lines.append(f"{lc}: fold at 1 024 slots / fold at 64 slots = {cells[1024] / cells[64]:.3f}")
    if "floors" in r:  # (a record made before the reference folds were measured has none)
        f = r["floors"]
        lines.append(
            f"the reference folds on the same report: floor_add {f['floor_add']:,.0f} (decode, add into one "
            f"stored sum, encode), plain fold {f['plain_fold']:,.0f} (aggregate - old slot + new, not exact)"
        )
        for row in r["rows"]:
            lines.append(
                f"{row['lifecycle']} at {row['slots']} slots: the fold is {row['over_floor_add']:.2f} x floor_add, "
                f"{row['over_plain_fold']:.2f} x the plain fold"
            )
    hist = {row["slots"]: row["fold"] for row in r["rows"] if row["lifecycle"] == "history"}
    state = {row["slots"]: row["fold"] for row in r["rows"] if row["lifecycle"] == "state"}
    for s in sorted(set(hist) & set(state)):
        lines.append(f"state / history at {s} slots: {state[s] / hist[s]:.3f}")
    m = {x["slots"]: x for x in r["marginal"]}
    first, last = min(m), max(m)
    lines.append(
        "one history key, per value (64 against 1 024 values): "
        + ", ".join(f"{x['per_value']:,.0f} at {s} slots" for s, x in m.items())
        + f" ({last} slots / {first} slots = {m[last]['per_value'] / m[first]['per_value']:.3f})"
    )
    lines.append(
        "one history key of 64 values: "
        + ", ".join(f"{x['fold_64_values']:,.0f} at {s} slots" for s, x in m.items())
        + " instructions per fold"
    )
    lines.append(
        f"this machine: {r['rate'] / 1e9:.2f} G instructions per second of the server's CPU on these folds "
        "(a redis-server of its own, INFO cpu, against callgrind's count)"
    )
    return "\n".join(lines)
