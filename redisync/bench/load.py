"""``redisync bench --load``: one primary measured at the report rate a capacity figure claims.

The Python collectors of ``--tree`` cannot reach one report a second each on this machine (they, not
the primaries, were the limit), so a "collectors at 1 Hz" figure from them is an extrapolation. This
generator is not the limit: every shard's fold is encoded once (its keys and arguments, as `publish`
sends them) and then sent again and again with the next sequence number, pipelined, from one
process. It measures, on a redis-server of its own:

- **redisync**: folds of the stated report (a 1 024-value key and a 256-value key with sums of
  squares, whole numbers) by ``slots`` shards, round robin; the server's CPU per fold (``INFO cpu``),
  the rate reached, and whether every shard reached one report a second. The run's fleet state is then
  checked against an independent sum of every shard's last report (exact: whole numbers).
- **the plain design** a user could write in an afternoon, side by side on the same server: each
  collector ``HSET``s its statistics as one blob into a hash and ``GET``s the pooled blob once per
  report, and a learner pools them every 0.5 s (``HGETALL``, a sum in numpy, ``SET``; its pools
  measured back to back). Its server CPU per report at one report a second per collector, the
  learner's two pools a second included. What it does not give: no validation, no deduplication
  (a retried write counts as a new one only by luck of the overwrite), no epochs across a store restart,
  no shard liveness, no exact sums in a fixed order, staleness up to the pooling period.

A capacity line is the share of a core (`CORE_BUDGET`) divided by the server CPU per report measured
here; it is measured, not extrapolated, only where the run reached that many reports a second.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import lifeline
from ..errors import ConnectionUnavailable
from ..redis_server import _wait_answers, command, free_port
from ..store.client import Store, connect
from ..store.codec import parse_publish
from ..store.connection import server_at
from ..store.schema import Limits, Schema
from .core import _captured
from .scale import CORE_BUDGET, FLEET_SCHEMA
from .tree import report

SLOTS = (64, 256, 1024)
FANOUT = (60, 150, 300)  # collectors, each subscribed, for the announcements' fan-out
WINDOW_S = 0.05  # the announcement window the fan-out runs with (and without: every fold announced)
DEPTH = 64  # folds per pipeline
POOL_EVERY_S = 0.5  # the plain design's learner pools this often


@contextlib.contextmanager
def private_server() -> Iterator[str]:
    """A redis-server of this bench's own (its CPU is the bench's alone), stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="redisync-load-") as workdir:
        port = free_port()
        proc = lifeline.popen(command(port, workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_answers(port)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(10)


def fold_load(
    url: str, slots: int, seconds: float, depth: int = DEPTH, *, window_s: float = 0.0, subscribed: bool = False
) -> dict[str, Any]:
    """``slots`` shards' folds of the stated report, pre-encoded and pipelined, for ``seconds``; with
    ``subscribed``, every collector holds a subscription to the run's announcements (a connection that
    ``SSUBSCRIBE``s, as a collector's listener does), and the announcements are counted."""
    store: Store = connect(url, run=f"bench-load-{uuid.uuid4().hex[:8]}")
    store.register(Schema.of(FLEET_SCHEMA), Limits(stream_maxlen=100, announce_every_s=window_s))
    listeners: list[Any] = []
    try:
        encoded, pulls = [], []
        for k in range(slots):
            shard = store.shard(k)
            encoded.append(_captured(store, lambda s=shard, k=k: s.publish(report(k, 1)), store.scripts.fold))  # type: ignore[misc]
            pulls.append(_captured(store, lambda k=k: store.pull(k)))  # type: ignore[misc]
        if subscribed:  # (after the first folds: only the measured ones are heard)
            for _ in range(slots):
                try:
                    listeners.append(store.server().subscriber(store.keys.channel))
                except ConnectionUnavailable as error:
                    raise ConnectionUnavailable(_limit_reached(len(listeners), slots, error)) from error
            heard = listeners[0]
            while heard.get_message(timeout=1.0) is not None:  # its confirmation
                pass
        seqs = [int(args[3]) for _, args in encoded]
        name, pull, names = store.scripts.fold.name, store.scripts.pull.name, list(FLEET_SCHEMA)
        server = store.server()
        client = server.client
        cpu0, t0, folds, k = server.cpu_s(), time.perf_counter(), 0, 0
        while time.perf_counter() - t0 < seconds:
            pipe = client.pipeline(transaction=False)
            for _ in range(depth):
                keys, args = encoded[k]
                seqs[k] += 1
                pipe.execute_command("FCALL", name, len(keys), *keys, *args[:3], seqs[k], *args[4:])
                pipe.execute_command("FCALL_RO", pull, len(pulls[k][0]), *pulls[k][0], *pulls[k][1])
                k = (k + 1) % slots
            for reply in pipe.execute()[::2]:
                if parse_publish(reply, names).status != "applied":
                    raise AssertionError(f"a generated fold was not applied: {reply!r}")
            folds += depth
        wall, cpu = time.perf_counter() - t0, server.cpu_s() - cpu0
        announcements = None
        if subscribed:  # (a window's debt is paid by a timer: counted within the run's seconds or not at all)
            announcements = 0
            while (message := listeners[0].get_message(timeout=0.2)) is not None:
                announcements += message["type"] == "smessage"
        fleet = store.fleet().keys
        exact = True  # the fleet against an independent sum of every shard's last report
        for n in names:
            parts = fleet[n].parts()
            for part, got in parts.items():
                expected = sum(np.asarray(report(j, 1)[n][part], dtype=np.float64) for j in range(slots))
                exact = exact and bool(np.array_equal(np.ravel(got), np.ravel(expected)))
        per_fold = cpu / folds
        rate = folds / wall
        return {
            "design": "redisync",
            "slots": slots,
            "reports": folds,
            "seconds": wall,
            "reports_per_s": rate,
            "per_collector_hz": rate / slots,
            "reached_1hz": rate / slots >= 1.0,
            "server_core": cpu / wall,
            "server_ms_per_report": per_fold * 1e3,
            "collectors_within_budget": CORE_BUDGET / per_fold,
            "exact": exact,
        } | (
            {}
            if announcements is None
            else {
                "window_s": window_s,
                "announcements_per_s": announcements / wall,
                "deliveries_per_s": announcements * slots / wall,
            }
        )
    finally:
        for listener in listeners:
            listener.close()
        store.delete()


def _limit_reached(held: int, wanted: int, error: Exception) -> str:
    """One line for a fan-out stopped by a limit: which one, and the figure that lets it run."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f"bench --load: subscription {held + 1} of {wanted} could not connect ({error}); the fan-out holds one "
        f"connection per collector, so it needs an open-file limit above {wanted + 64} (now {soft}: raise it with "
        f"'ulimit -n {max(1024, 2 * wanted)}') and a server accepting that many clients (maxclients)"
    )


def plain_load(url: str, collectors: int, seconds: float, depth: int = DEPTH) -> dict[str, Any]:
    """The plain HSET / pool / GET design with ``collectors`` collectors, for ``seconds``."""
    server = server_at(url)
    client = server.client
    base = f"plain-{uuid.uuid4().hex[:8]}"
    stats, pooled = f"{base}:stats", f"{base}:pooled"
    width = 1 + 1024 + 1 + 256 + 256  # the stated report's numbers
    blobs = [np.full(width, float(1 + k % 13)).tobytes() for k in range(collectors)]
    client.hset(stats, mapping={str(k): blobs[k] for k in range(collectors)})
    client.set(pooled, np.zeros(width).tobytes())
    try:
        cpu0, t0, reports, k = server.cpu_s(), time.perf_counter(), 0, 0
        while time.perf_counter() - t0 < seconds:  # the collectors: a report and a pull each
            pipe = client.pipeline(transaction=False)
            for _ in range(depth):
                pipe.hset(stats, str(k), blobs[k])
                pipe.get(pooled)
                k = (k + 1) % collectors
            pipe.execute()
            reports += depth
        wall, per_report = time.perf_counter() - t0, (server.cpu_s() - cpu0) / reports
        cpu0, pools = server.cpu_s(), 0
        for _ in range(max(3, int(20 * 64 / collectors))):  # the learner's pooling, back to back
            total = np.sum([np.frombuffer(v) for v in client.hgetall(stats).values()], axis=0)
            client.set(pooled, total.tobytes())
            pools += 1
        per_pool = (server.cpu_s() - cpu0) / pools
        exact = np.array_equal(
            np.frombuffer(client.get(pooled) or b""), np.sum([np.frombuffer(b) for b in blobs], axis=0)
        )
        # at one report a second per collector: its report and pull, and the learner's two pools a second
        per = per_report + per_pool / POOL_EVERY_S / collectors
        return {
            "design": "plain HSET / pool / GET",
            "slots": collectors,
            "reports": reports,
            "seconds": wall,
            "reports_per_s": reports / wall,
            "per_collector_hz": reports / wall / collectors,
            "reached_1hz": reports / wall / collectors >= 1.0,
            "server_core": per_report * reports / wall,
            "server_ms_per_pool": per_pool * 1e3,
            "server_ms_per_report": per * 1e3,
            "collectors_within_budget": CORE_BUDGET / (per_report + per_pool / POOL_EVERY_S / collectors),
            "exact": bool(exact),
        }
    finally:
        client.delete(stats, pooled)
        client.close()


def run_load(seconds: float = 10.0, slots: tuple[int, ...] = SLOTS, fanout: tuple[int, ...] = FANOUT) -> dict[str, Any]:
    """Both designs at each fleet size, side by side on one private server, one after the other; then
    redisync with every collector subscribed, with and without an announcement window."""
    rows, fan = [], []
    with private_server() as url:
        for n in slots:
            rows.append(fold_load(url, n, seconds))
            rows.append(plain_load(url, n, seconds))
        for n in fanout:
            for window in (0.0, WINDOW_S):
                fan.append(fold_load(url, n, seconds, window_s=window, subscribed=True))
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "seconds": seconds,
        "core_budget": CORE_BUDGET,
        "rows": rows,
        "fanout": fan,
    }


def measured(row: dict[str, Any]) -> bool:
    """Whether a row's capacity was measured: the run had at least that many collectors and each
    reached one report a second (a cost per report grows with the fleet, and may with the rate)."""
    return bool(row["reached_1hz"]) and row["collectors_within_budget"] <= row["slots"]


def format_load(r: dict[str, Any]) -> str:
    """A table: per design and fleet size, the rate reached and what the server spent."""
    head = (
        f"bench --load, {r['date']}: one generator process, pipelined pre-encoded reports, a private redis-server; "
        f"{r['cpus']} CPUs, load average {r['load_average'][0]:.1f} at the end\n"
        "the stated report: 1 024 values + 256 values with sums of squares per collector\n\n"
    )
    lines = [
        "| design | collectors | reports/s reached (per collector) | server core | server ms per report "
        "| server core for these collectors at 1 Hz | collectors at 1 Hz within half a core | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in r["rows"]:
        capacity = f"{row['collectors_within_budget']:.0f}"
        if not measured(row):
            capacity += f" (extrapolated from {row['slots']} collectors at {row['per_collector_hz']:.2f} Hz)"
        lines.append(
            f"| {row['design']} | {row['slots']} | {row['reports_per_s']:.0f} ({row['per_collector_hz']:.2f}) "
            f"| {row['server_core']:.2f} | {row['server_ms_per_report']:.3f} "
            f"| {row['slots'] * row['server_ms_per_report'] / 1e3:.2f} | {capacity} | "
            f"{'yes' if row['exact'] else 'NO'} |"
        )
    if r.get("fanout"):
        lines += [
            "",
            "every collector subscribed to the run's announcements:",
            "",
            "| collectors | announcement window | reports/s reached | announcements/s | deliveries/s "
            "| deliveries per collector per second | server ms per report |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in r["fanout"]:
            window = "every fold" if row["window_s"] == 0 else f"{row['window_s'] * 1e3:.0f} ms"
            lines.append(
                f"| {row['slots']} | {window} | {row['reports_per_s']:.0f} | {row['announcements_per_s']:.1f} "
                f"| {row['deliveries_per_s']:.0f} | {row['announcements_per_s']:.1f} | {row['server_ms_per_report']:.3f} |"
            )
    return head + "\n".join(lines)
