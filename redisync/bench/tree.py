"""``redisync bench --tree``: one run of a thousand collectors and more over a Cluster's primaries.

The run is split into one sub-run per primary (`redisync.aggregation`), an aggregator per sub-run
runs in this process, and simulated collectors in ``processes`` spawned processes each publish the
stated report (`FLEET_SCHEMA`: a 1 024-value history key and a 256-value one with sums of squares)
once a second and pull their sub-run once a second, from a pool of threads; a sink process holds one
sharded subscription per collector to its sub-run's channel, as a collector's listener does, so the
servers pay the announcements' fan-out. Every report is made of whole numbers: at the end the root's
fleet must equal the sum of every collector's last report, bit for bit. A probe shard in sub-run 0
raises a one-value ``maximum`` key every few seconds; the time until each other sub-run and the
root show it is the staleness the split adds. Each primary's CPU (``INFO cpu``) over the window
gives the collectors one primary serves at half a core, fan-out, pulls and aggregators included.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import selectors
import shutil
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from ..aggregation import Aggregator, split
from ..errors import RedisyncError
from ..lifeline import spawn
from ..store.client import Store, connect, masked_url
from ..store.connection import server_at
from ..store.schema import Limits, Schema, maximum
from ..store.server import ClientError, Server
from ..terms.sampler_options import SAMPLER_KEY
from .scale import CORE_BUDGET, FLEET_SCHEMA

PROBE = "probe/raised"
SCHEMA = Schema.of({**FLEET_SCHEMA, PROBE: maximum(1)})
STATED = "each collector publishes the stated report once a second and pulls its sub-run once a second"


def report(k: int, i: int) -> dict[str, Any]:
    """Collector ``k``'s cumulative report after its ``i``-th publish: whole numbers only."""
    base = 1 + k % 13
    return {
        SAMPLER_KEY: {"count": float(i * base), "sum": np.full(1024, float(i * (k % 5)))},
        "obs/norm": {
            "count": float(i * base),
            "sum": np.full(256, float(i * (k % 3 - 1))),
            "sumsq": np.full(256, float(i * (k % 3 + 1))),
        },
    }


def _collectors(
    url: str, run: str, ids: list[int], threads: int, seconds: float, stop: Any, phases: tuple[Any, Any, Any], out: str
) -> None:
    """One process of simulated collectors: each publishes once a second and pulls once a second;
    what they did is written to the file ``out``, as JSON."""
    root = connect(url, run=run)
    homes: dict[str, Store] = {}
    shards = {}
    for k in ids:
        home = root.home(k)
        home = homes.setdefault(home.run, home)
        home.register(SCHEMA)
        shards[k] = home.shard(k)
    published = dict.fromkeys(ids, 0)
    counts = {"publishes": 0, "pulls": 0, "late_s": 0.0, "errors": 0}
    lock = threading.Lock()
    started, go, looped = phases
    started.set()
    go.wait()
    began = time.monotonic()

    def serve(mine: list[int]) -> None:
        rng = np.random.default_rng(mine[0] if mine else 0)
        phase = {k: float(rng.random()) for k in mine}
        events = sorted([(phase[k], k, "publish") for k in mine] + [(phase[k] + 0.5, k, "pull") for k in mine])
        t = 0
        while not stop.is_set():
            for offset, k, what in events:
                due = began + t + offset
                wait = due - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    return
                if time.monotonic() - began > seconds:
                    return
                try:
                    if what == "publish":
                        shards[k].publish(report(k, published[k] + 1))
                        published[k] += 1
                    else:
                        shards[k].pull(check_first=True)
                except (ClientError, RedisyncError):
                    with lock:
                        counts["errors"] += 1
                    continue
                with lock:
                    counts["publishes" if what == "publish" else "pulls"] += 1
                    counts["late_s"] = max(counts["late_s"], time.monotonic() - due)
            t += 1

    threads = min(threads, len(ids))
    pool = [threading.Thread(target=serve, args=(ids[i::threads],), daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    looped.set()
    Path(out).write_text(json.dumps({"published": published, "in_window": published, **counts}))


class _Reporter:
    """A simulated collector's term: its ``i``-th report is `report` ``(k, i)``; it keeps the fleet
    state its Syncer hands it at a reset boundary."""

    def __init__(self, k: int):
        self.k, self.i, self.fleet_count = k, 0, 0.0
        self.key = "obs/norm"

    def schema_entries(self) -> dict[str, Any]:
        return dict(SCHEMA.keys)

    def report_shard_state(self) -> dict[str, Any]:
        self.i += 1
        return report(self.k, self.i)

    def apply_shard_state(self, fleet: Any) -> None:
        view = fleet.keys.get(self.key)
        if view is not None and view.value is not None:
            self.fleet_count = float(view.parts()["count"])


def _syncers(
    url: str, run: str, ids: list[int], seconds: float, stop: Any, phases: tuple[Any, Any, Any], out: str
) -> None:
    """One process of collectors, each a `Syncer` with its thread worker (a publisher thread and a
    listener on its sub-run's channel): a report due once a second, pulls at most once a second, the
    reset boundary ten times a second. What they published is written to ``out``, as JSON."""
    from ..collector.workers import new_syncer

    logging.getLogger("redisync").setLevel(logging.ERROR)  # (a thousand collectors' recoveries: counted below)
    terms = {k: _Reporter(k) for k in ids}
    syncers = {}
    for k in ids:
        syncers[k] = new_syncer(
            connect(url, run=run),  # a client of its own, as a collector process has
            k,
            [terms[k]],
            worker="thread",
            publish_every_s=1.0,
            publish_every_steps=10**9,
            min_pull_interval_s=1.0,
            poll_every_s=5.0,
            start_timeout_s=60.0,
        )
    for syncer in syncers.values():
        syncer.start()
    started, go, looped = phases
    started.set()
    go.wait()
    first = {k: s.stats["publishes"] for k, s in syncers.items()}  # (folds applied: a coalesced report is not one)
    began = time.monotonic()
    boundaries = 0
    while time.monotonic() - began < seconds and not stop.is_set():
        tick = time.monotonic()
        for syncer in syncers.values():
            syncer.on_step()
            syncer.at_reset_boundary()
        boundaries += 1
        stop.wait(max(0.0, 0.1 - (time.monotonic() - tick)))
    looped.set()
    in_window = {k: s.stats["publishes"] - first[k] for k, s in syncers.items()}
    flushed = sum(bool(s.stop(flush=True, timeout=60.0)) for s in syncers.values())
    stats = [s.stats for s in syncers.values()]
    Path(out).write_text(
        json.dumps(
            {
                "published": {k: t.i for k, t in terms.items()},
                "in_window": in_window,
                "publishes": sum(st["publishes"] for st in stats),
                "pulls": sum(st["pulls"] for st in stats),
                "errors": sum(st["publish_failures"] + st["pull_failures"] + st["worker_errors"] for st in stats),
                "late_s": max(0.0, (time.monotonic() - began) - seconds),
                "boundaries_per_s": boundaries / seconds,
                "flushed": flushed,
                "announcements": sum(getattr(s.worker, "_listened", 0) for s in syncers.values()),
            }
        )
    )


def _sink(nodes: list[tuple[str, int, str]], ready: Any, stop: Any, out: Any) -> None:
    """One sharded subscription per collector (host, port, channel), drained; messages counted."""
    selector = selectors.DefaultSelector()
    socks = []
    for host, port, channel in nodes:
        s = socket.create_connection((host, port))
        c = channel.encode()
        s.sendall(b"*2\r\n$10\r\nSSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(c), c))
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        socks.append(s)
    ready.set()
    seen = 0
    tail = b""
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.2):
            data = key.fileobj.recv(1 << 16)  # type: ignore[union-attr]
            chunk = tail + data
            seen += chunk.count(b"smessage")
            tail = chunk[-8:]
    out.put({"messages": seen, "subscriptions": len(socks)})
    for s in socks:
        s.close()


def _host_port(node: str) -> tuple[str, int]:
    host, port = node.rsplit(":", 1)
    return host, int(port)


def _primary_servers(root: Store) -> dict[str, Server]:
    """Each Cluster primary by its host:port, for its CPU seconds."""
    return {name: server_at(f"redis://{name}/0") for name in root.primaries()}


def _probe(root: Store, names: list[str], stop: threading.Event, every_s: float, found: list[dict[str, float]]) -> None:
    """Raise the probe key in sub-run 0 every ``every_s``; time until the other sub-runs and the root show it."""
    writer = root.sibling(names[0]).shard(len(names) * 10**6)  # (a shard id of sub-run 0, no collector's)
    readers = {name: root.sibling(name) for name in names[1:]} | {"root": root}
    raised = 0
    while not stop.wait(every_s):
        raised += 1
        began = time.monotonic()
        writer.publish({PROBE: {"value": [float(raised)]}})
        seen: dict[str, float] = {}
        while len(seen) < len(readers) and time.monotonic() - began < 10 and not stop.is_set():
            for name, store in readers.items():
                if name not in seen:
                    view = store.fleet().keys.get(PROBE)
                    if view is not None and view.value is not None and view.value[0] >= raised:
                        seen[name] = time.monotonic() - began
            time.sleep(0.005)
        found.append(seen)


def run_tree(
    url: str,
    collectors: int = 1002,
    seconds: float = 60.0,
    processes: int = 3,
    threads: int = 24,
    period_s: float = 0.5,
    announce_every_s: float = 0.05,
    split_run: bool = True,
    syncers: bool = True,
    one_primary: bool = False,
) -> dict[str, Any]:
    """The run, as figures: rates, staleness, per-primary CPU and capacity, and the exactness check.
    ``split_run=False``: the same collectors on one run in one slot, one primary (side by side).
    ``one_primary``: the sub-runs all on one primary (a tree that adds no server).
    ``syncers``: each collector a `Syncer` with its thread worker and its own subscription; else a
    shard client driven from a pool of threads, and a sink process holding the subscriptions."""
    root = connect(url, run=f"bench-tree-{uuid.uuid4().hex[:8]}")
    if not root.primaries():
        raise RedisyncError(f"{masked_url(url)}: --tree needs a Redis Cluster URL (redis+cluster://)")
    primaries = _primary_servers(root)
    on = sorted(primaries)[:1] if one_primary else None
    names = split(root, len(primaries), on) if split_run else []
    homes = names or [root.run]  # where the collectors publish
    limits = Limits(stream_maxlen=100, announce_every_s=announce_every_s)
    for name in names:
        root.sibling(name).register(SCHEMA, limits)
    root.register(SCHEMA, limits)
    node_of = {name: root.primary_of(name) for name in homes}  # host:port
    ctx = mp.get_context("spawn")
    stop, ready, sink_out = ctx.Event(), ctx.Event(), ctx.Queue()
    started, looped = [ctx.Event() for _ in range(processes)], [ctx.Event() for _ in range(processes)]
    go = ctx.Event()  # every process has started its collectors: the measured window opens
    outs = [Path(tempfile.mkdtemp(prefix="redisync-tree-")) / "collectors.json" for _ in range(processes)]
    home_of = [homes[k % len(homes)] for k in range(collectors)]
    subscriptions = [(*_host_port(node_of[h]), f"redisync:{{{h}}}:versions") for h in home_of]
    sink = None if syncers else spawn(_sink, subscriptions, ready, stop, sink_out)
    if sink is not None and not ready.wait(60):
        raise RedisyncError("the subscription sink did not start")
    ids = list(range(collectors))
    workers = [
        spawn(_syncers, url, root.run, ids[p::processes], seconds, stop, (started[p], go, looped[p]), str(outs[p]))
        if syncers
        else spawn(
            _collectors,
            url,
            root.run,
            ids[p::processes],
            threads,
            seconds,
            stop,
            (started[p], go, looped[p]),
            str(outs[p]),
        )
        for p in range(processes)
    ]
    halt = threading.Event()
    aggregators = [Aggregator(root, j, period_s=period_s) for j in range(len(names))]
    agg_threads = [threading.Thread(target=a.run, args=(halt,), daemon=True) for a in aggregators]
    for thread in agg_threads:
        thread.start()
    for event in started:  # (the processes' start-up: imports, claims, a thousand Syncers started)
        event.wait(900)
    cpu0 = {n: c.cpu_s() for n, c in primaries.items()}
    window0 = time.monotonic()
    go.set()
    staleness: list[dict[str, float]] = []
    probe_stop = threading.Event()
    prober = threading.Thread(target=_probe, args=(root, names, probe_stop, 3.0, staleness), daemon=True)
    if names:
        prober.start()
    for event in looped:
        event.wait(seconds + 600)
    window = time.monotonic() - window0
    cpu = {n: (c.cpu_s() - cpu0[n]) / window for n, c in primaries.items()}
    for worker in workers:
        worker.join(timeout=900)
    results = [json.loads(path.read_text()) for path in outs if path.exists()]
    for path in outs:
        shutil.rmtree(path.parent, ignore_errors=True)
    probe_stop.set()
    if names:
        prober.join()
    stop.set()
    sink_result = sink_out.get(timeout=30) if sink is not None else None
    for p in [*([sink] if sink is not None else []), *workers]:
        p.join(timeout=10)
    if len(results) < processes:
        halt.set()
        codes = [p.exitcode for p in workers]
        raise RedisyncError(
            f"{processes - len(results)} of {processes} collector processes failed (exit codes {codes})"
        )
    published: dict[int, int] = {}
    in_window: dict[int, int] = {}
    for r in results:
        published.update({int(k): i for k, i in r["published"].items()})
        in_window.update({int(k): i for k, i in r["in_window"].items()})
    want: dict[str, dict[str, Any]] = {name: {} for name in FLEET_SCHEMA}
    for k, i in published.items():
        for name, parts in report(k, i).items():
            for part, value in parts.items():
                want[name][part] = want[name].get(part, 0.0) + np.asarray(value, dtype=float)

    def exact() -> bool:
        fleet = root.fleet().keys
        return all(
            np.array_equal(np.asarray(fleet[name].parts()[part]).ravel(), np.asarray(value).ravel())
            for name, parts in want.items()
            for part, value in parts.items()
        )

    settled_at = time.monotonic()
    while not exact() and time.monotonic() - settled_at < 20:
        time.sleep(period_s / 2)
    is_exact, settle_s = exact(), time.monotonic() - settled_at
    root_count = float(root.fleet().keys["obs/norm"].parts()["count"])
    halt.set()
    for thread in agg_threads:
        thread.join(timeout=5)
    homed = {name: home_of.count(name) for name in homes}
    per_primary = []
    for node in sorted({node_of[name] for name in homes}):
        served = [name for name in homes if node_of[name] == node]
        reports = sum(i for k, i in in_window.items() if home_of[k] in served) / window
        per_primary.append(
            {
                "primary": node,
                "subrun": ", ".join(served),
                "collectors": sum(homed[name] for name in served),
                "reports_per_s": reports,
                "cores": cpu[node],
                # a report's whole cost to its primary: its fold, its collector's pull, its share of the
                # announcements and of the aggregator's rounds; at one report a second per collector:
                "collectors_at_budget": CORE_BUDGET * reports / cpu[node] if cpu[node] > 0 else float("inf"),
            }
        )
    delays = {name: [s[name] for s in staleness if name in s] for name in [*names[1:], "root"]} if names else {}
    for name in [*names, root.run]:
        root.sibling(name).delete()
    return {
        "url": masked_url(url),
        "collectors": collectors,
        "subruns": names,
        "homes": homes,
        "seconds": window,
        "publishes_per_s": sum(in_window.values()) / window,
        "pulls_per_s": sum(r["pulls"] for r in results) / window,
        "client_errors": sum(r["errors"] for r in results),
        "latest_event_late_s": max(r["late_s"] for r in results),
        "announcements_delivered_per_s": (
            sink_result["messages"] if sink_result else sum(r["announcements"] for r in results)
        )
        / window,
        "subscriptions": sink_result["subscriptions"] if sink_result else collectors,
        "collectors_kind": "syncers (thread workers)" if syncers else "shard clients from a pool of threads",
        "flushed": sum(r.get("flushed", 0) for r in results) if syncers else None,
        "aggregator_rounds": sum(a.rounds for a in aggregators),
        "exact": is_exact,
        "settle_s": settle_s,
        "root_count": root_count,
        "staleness_s": {
            name: {"n": len(d), "median": statistics.median(d), "max": max(d)} if d else None
            for name, d in delays.items()
        },
        "per_primary": per_primary,
        "core_budget": CORE_BUDGET,
        "announce_every_s": announce_every_s,
        "period_s": period_s,
    }


def format_tree(r: dict[str, Any]) -> str:
    where = (
        f"split into {len(r['subruns'])} sub-runs over {len({p['primary'] for p in r['per_primary']})} primaries"
        if r["subruns"]
        else "unsplit, on one primary"
    )
    lines = [
        f"one run {where} ({r['url']}): {r['collectors']} collectors, {r['seconds']:.0f} s measured ({r['collectors_kind']}: {STATED})",
        f"  sub-runs: {', '.join(r['subruns']) or 'none'}; aggregator period {r['period_s']:g} s; announcements "
        + (f"at most one per {r['announce_every_s']:g} s per run" if r["announce_every_s"] else "on every fold"),
        f"  publishes {r['publishes_per_s']:.0f}/s, pulls {r['pulls_per_s']:.0f}/s, announcements delivered "
        f"{r['announcements_delivered_per_s']:.0f}/s to {r['subscriptions']} subscriptions; client errors "
        f"{r['client_errors']}; the latest event ran {r['latest_event_late_s']:.2f} s behind its schedule",
        f"  exact: {'yes' if r['exact'] else 'NO'} (the root's fleet equals the sum of every collector's last "
        f"report, bit for bit; count {r['root_count']:.0f}), {r['settle_s']:.1f} s after the last publish; "
        f"{r['aggregator_rounds']} aggregator rounds"
        + (
            f"; {r['flushed']} of {r['collectors']} syncers published their last report at stop"
            if r["flushed"] is not None
            else ""
        ),
    ]
    if r["staleness_s"]:
        lines.append("  staleness (a value published in sub-run 0 until it shows):")
    for name, s in r["staleness_s"].items():
        lines.append(
            f"    {name:<24} "
            + ("not seen" if s is None else f"median {s['median']:.2f} s, max {s['max']:.2f} s, n={s['n']}")
        )
    lines.append(
        f"  per primary (CPU from INFO cpu over the window, per report: fold, pull, announcements, aggregator; "
        f"budget {r['core_budget']:g} core):"
    )
    for p in r["per_primary"]:
        lines.append(
            f"    {p['primary']:<18} {p['subrun']:<24} {p['collectors']:>5} collectors, {p['reports_per_s']:.0f} reports/s: "
            + (
                f"{p['cores']:.3f} core, {1e3 * p['cores'] / p['reports_per_s']:.2f} ms a report -> "
                f"{p['collectors_at_budget']:.0f} collectors reporting at 1 Hz within the budget"
                if p["reports_per_s"] > 0
                else f"{p['cores']:.3f} core, no report folded in the window (no cost per report to give)"
            )
        )
    return "\n".join(lines)
