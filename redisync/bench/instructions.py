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
from ..store.client import connect
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
                connect(self.url, run="probe").redis.ping()
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
    r = connect(server.url, run="floors", socket_timeout=600).redis
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
