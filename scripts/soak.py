"""Soak test: many collector processes publish and pull through Syncers while Redis is killed and paused.

    scripts/soak --collectors 32 --seconds 600 --faults kill@120,stop@300:5,kill@450
    scripts/soak --url redis://host:6379/0 --seconds 60          (no faults: the server is not ours)

Without --url it starts a private redis-server (no persistence) on a free port, so that the fault
schedule can SIGKILL (and restart, empty) or SIGSTOP it. Each collector keeps cumulative own
statistics of a merge key of --elements float64 and publishes them every --publish-every seconds.
The faults' times and every collector's --seconds count from the moment all collectors have started
(each has its first report in the store), so that the faults land on a running fleet however slowly
the processes start. At the end every collector's final report must be in the fleet: "lost" counts
those that are not.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

import numpy as np

import redisync
from redisync import redis_server
from redisync.collector.workers import new_syncer
from redisync.lifeline import popen, spawn
from redisync.store.schema import merge

KEY = "soak/stats"


class CumulativeStats:
    """A collector term: this shard's running count and sum of what it saw (a merge key)."""

    def __init__(self, elements: int, shard: int):
        self.rng = np.random.default_rng(shard)
        self.count, self.total = 0.0, np.zeros(elements)
        self.elements = elements
        self.fleet_version = 0

    def step(self) -> None:
        self.count += 1
        self.total += self.rng.random(self.elements)

    def schema_entries(self):
        return {KEY: merge(self.elements, lifecycle="history")}

    def report_shard_state(self):
        return {KEY: {"count": self.count, "sum": self.total.copy()}}

    def apply_shard_state(self, fleet) -> None:
        self.fleet_version = fleet.fleet_version


def collector(
    url: str, run: str, shard: int, seconds: float, elements: int, every: float, worker: str, out: Any, go: Any
) -> None:
    term = CumulativeStats(elements, shard)
    syncer = new_syncer(
        redisync.connect(url, run=run, socket_timeout=2.0),
        shard,
        [term],
        publish_every_steps=1,
        poll_every_s=1.0,
        retry_every_s=0.2,
        worker=worker,
    ).start()
    term.step()  # a first report, in the store before the fleet starts together
    syncer.on_step()
    syncer.flush()
    out.put({"ready": shard, "synced": syncer.wait_synced(timeout=120)})
    if not go.wait(timeout=900):  # the soak itself gave up waiting for the others
        syncer.stop(flush=False)
        return
    versions, end = set(), time.monotonic() + seconds
    while time.monotonic() < end:
        term.step()
        syncer.on_step()
        syncer.at_reset_boundary()
        versions.add(term.fleet_version)
        time.sleep(every)
    synced = syncer.wait_synced(timeout=60)
    syncer.stop(flush=False)
    out.put(
        {
            "shard": shard,
            "count": term.count,
            "sum": term.total.sum(),
            "synced": synced,
            "stats": dict(syncer.stats),
            "latencies": list(syncer.latencies_ms),
            "versions_seen": len(versions),
        }
    )


class Server:
    def __init__(self) -> None:
        if not shutil.which("redis-server"):
            sys.exit("soak: redis-server not found (scripts/ensure-redis installs it)")
        self.port, self.dir = redis_server.free_port(), tempfile.mkdtemp(prefix="redisync-soak-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        # SIGTERMed when the soak dies, even when restarted by the fault thread
        self.proc = popen(redis_server.command(self.port, self.dir), stdout=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
                return
            except OSError:
                time.sleep(0.02)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def parse_faults(spec: str) -> list[tuple[float, str, float]]:
    """'kill@20,stop@40:3' -> [(20, 'kill', 2), (40, 'stop', 3)] (kill: down for the duration, default 2 s)."""
    faults = []
    for item in filter(None, spec.split(",")):
        what, _, rest = item.partition("@")
        at, _, dur = rest.partition(":")
        if what not in ("kill", "stop"):
            raise SystemExit(f"soak: unknown fault {what!r} (kill@T[:DOWN] or stop@T[:PAUSE])")
        faults.append((float(at), what, float(dur or 2)))
    return sorted(faults)


def run_faults(server: Server, store: redisync.Store, faults, t0: float, collectors: int, log: list) -> None:
    for at, what, duration in faults:
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        if what == "stop":
            server.signal(signal.SIGSTOP)
            time.sleep(duration)
            server.signal(signal.SIGCONT)
            log.append({"fault": f"SIGSTOP {duration:g}s at {at:g}s", "recovery_s": None})
            continue
        server.kill()
        time.sleep(duration)
        server.start()
        restarted = time.monotonic()
        recovery = None
        while time.monotonic() - restarted < 120:  # until every collector's slot is back
            try:
                writers = store.key_info(KEY).get("writers", "")
                if len(list(filter(None, writers.split(",")))) == collectors:
                    recovery = time.monotonic() - restarted
                    break
            except redisync.RedisyncError:
                pass
            time.sleep(0.05)
        log.append({"fault": f"SIGKILL at {at:g}s, down {duration:g}s", "recovery_s": recovery})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="an existing Redis (no faults are injected then)")
    p.add_argument("--collectors", type=int, default=32)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--elements", type=int, default=1024)
    p.add_argument(
        "--publish-every", type=float, default=0.05, help="seconds between a collector's steps (one report each)"
    )
    p.add_argument(
        "--worker",
        choices=("thread", "process"),
        default="thread",
        help="the Syncer's worker (thread: 32 collectors are 32 processes, not 64)",
    )
    p.add_argument("--faults", default="kill@20,stop@40:3", help="e.g. kill@120,stop@300:5 (times from the start)")
    args = p.parse_args(argv)

    server = None
    url = args.url
    faults = parse_faults(args.faults) if not args.url else []
    if url is None:
        server = Server()
        server.start()
        url = server.url
    run = f"soak-{uuid.uuid4().hex[:6]}"
    store = redisync.connect(url, run=run, socket_timeout=2.0)
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [  # each dies with the soak
        spawn(collector, url, run, i, args.seconds, args.elements, args.publish_every, args.worker, out, go)
        for i in range(args.collectors)
    ]
    started = [out.get(timeout=600) for _ in procs]  # every collector's first report is in the store
    if not all(r["synced"] for r in started):
        print(f"soak: collectors {[r['ready'] for r in started if not r['synced']]} could not sync their first report")
    go.set()
    t0, log = time.monotonic(), []
    faulter = None
    if server is not None and faults:
        faulter = threading.Thread(target=run_faults, args=(server, store, faults, t0, args.collectors, log))
        faulter.start()
    results = [out.get(timeout=args.seconds + 300) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    if faulter is not None:
        faulter.join()

    fleet = store.fleet().keys[KEY].parts()
    slots = store.redis.hgetall(store.keys.key_data(KEY))
    lost = 0
    for r in results:  # each collector's final report must be its slot (whose first value is its count)
        slot = slots.get(f"slot:{r['shard']}".encode())
        if slot is None or float(np.frombuffer(slot[:8], "<f8")[0]) != r["count"]:
            lost += 1
    total_count = sum(r["count"] for r in results)
    lat = sorted(x for r in results for x in r["latencies"])
    stats = {k: sum(r["stats"][k] for r in results) for k in results[0]["stats"]}
    sent = stats["publishes"] + stats["duplicates"] + stats["rejected"]
    print(
        f"soak: {args.collectors} collectors x {args.seconds:g}s, a merge key of {args.elements} float64, "
        f"a report every {args.publish_every:g}s, {args.worker} workers, against {args.url or 'a private redis-server'}"
    )
    print(
        f"reports sent {sent}  applied {stats['publishes']}  duplicates {stats['duplicates']}  rejected {stats['rejected']}  "
        f"coalesced {stats['coalesced']}  failed attempts {stats['publish_failures']}  re-seeds {stats['reseeds']}"
    )
    print(
        f"lost {lost}  (fleet count {float(fleet['count']):.0f} = sum of final reports {total_count:.0f}: "
        f"{float(fleet['count']) == total_count})"
    )
    if lat:
        print(f"publish latency p50 {statistics.median(lat):.2f} ms  p99 {lat[int(0.99 * (len(lat) - 1))]:.2f} ms")
    print(
        f"fleet versions: final {store.fleet().fleet_version}, seen per collector (median) "
        f"{statistics.median(r['versions_seen'] for r in results):.0f}"
    )
    for entry in log:
        rec = entry["recovery_s"]
        print(
            f"fault {entry['fault']}: "
            + (
                "collectors kept stepping"
                if rec is None and "STOP" in entry["fault"]
                else f"every slot back {rec:.2f}s after the restart"
                if rec is not None
                else "NOT RECOVERED"
            )
        )
    store.delete()
    if server is not None:
        server.kill()
    ok = lost == 0 and float(fleet["count"]) == total_count and all(r["synced"] for r in (*started, *results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
