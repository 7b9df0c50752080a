"""``redisync bench``: what a publish, a pull and a fold cost, beside their floors and peers."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import click

from ..store.client import EMBEDDED
from .common import URL, connected, needs, table


@click.command(short_help="Measure latency, server fold cost and capacity.")
@URL
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--calls", default=1000, show_default=True, type=click.IntRange(10, 10**6), help="calls per median")
@click.option("--procs", default=8, show_default=True, type=click.IntRange(1, 64), help="concurrent publishers")
@click.option(
    "--seconds",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0.1, 600),
    help="concurrency phase length (--load, --tree: each measurement's)",
)
@click.option(
    "--peers", is_flag=True, help="instead: collector processes syncing through redisync vs torch.distributed (gloo)"
)
@click.option(
    "--steps", default=2000, show_default=True, type=click.IntRange(100, 10**6), help="--peers: steps per collector"
)
@click.option("--scale", is_flag=True, help="instead: cost against slots, keys, memory, connections; the largest fleet")
@click.option(
    "--instructions",
    is_flag=True,
    help="instead: the server's instructions per fold (a redis-server of its own under valgrind's callgrind)",
)
@click.option(
    "--fleet",
    is_flag=True,
    help="--instructions: the stated report's fold and pull at 4, 64 and 1 024 live slots, history and state keys; "
    "the cost per value at 4 and 64 slots; the capacity per primary from the instructions",
)
@click.option(
    "--churn",
    is_flag=True,
    help="instead: 10 000 shard ids passed one after another through 64 live collectors on a redis-server of its "
    "own; the run's memory with the live slots alone, at its highest and after the graces, and the fold's "
    "instructions before and after (where valgrind is installed)",
)
@click.option(
    "--load",
    is_flag=True,
    help="instead: a redis-server of its own driven by pre-encoded, pipelined reports of 64, 256 and 1 024 "
    "collectors for --seconds each, redisync beside a plain HSET / pool / GET design; the rate each reached",
)
@click.option(
    "--tree",
    is_flag=True,
    help="instead: one run split over a Cluster's primaries, --collectors simulated collectors for --seconds "
    "(with --loopback-cluster: on a Cluster of three primaries started for the run)",
)
@click.option(
    "--collectors", default=1002, show_default=True, type=click.IntRange(3, 100_000), help="--tree: collectors"
)
@click.option("--loopback-cluster", is_flag=True, help="--tree: start a loopback Cluster of three primaries for it")
@click.option("--unsplit", is_flag=True, help="--tree: the same collectors on one run, one primary (to compare)")
@click.option("--one-primary", is_flag=True, help="--tree: every sub-run on one primary (a tree that adds no server)")
@click.option(
    "--shard-clients",
    is_flag=True,
    help="--tree: lighter collectors (shard clients from a pool of threads, a sink holding their subscriptions) "
    "instead of a Syncer each",
)
@click.option(
    "--announce-every",
    default=0.05,
    show_default=True,
    type=click.FloatRange(0, 10),
    help="--tree: the runs' announcement window in seconds (0: every fold announced)",
)
@click.option(
    "--all",
    "everything",
    is_flag=True,
    help="the core figures, --peers and --scale in one run (with --json: one document)",
)
@click.option(
    "--quick",
    is_flag=True,
    help="every measurement of the chosen mode at a small size: checks that it runs end to end here "
    "(its figures are not the ones to quote)",
)
@click.option(
    "--targets",
    "show_targets",
    is_flag=True,
    help="for redisync's developers: also print the project's performance targets and whether this run met them",
)
def bench(
    url: str | None,
    as_json: bool,
    calls: int,
    procs: int,
    seconds: float,
    peers: bool,
    steps: int,
    scale: bool,
    instructions: bool,
    fleet: bool,
    churn: bool,
    load: bool,
    tree: bool,
    collectors: int,
    loopback_cluster: bool,
    announce_every: float,
    unsplit: bool,
    shard_clients: bool,
    one_primary: bool,
    everything: bool,
    quick: bool,
    show_targets: bool,
) -> None:
    """Latency of PING, publish and pull; server fold time; concurrent throughput vs WATCH/MULTI.
    With --peers: the collector's blocking time per step, redisync's workers beside gloo collectives.
    With --scale: how the server's cost grows with the fleet, and the largest fleet one Redis serves.
    With --tree: a thousand collectors and more in one run over a Cluster's primaries, exact.
    With --load: one primary at the report rate a capacity figure claims, beside a plain design.
    With --churn: a run's memory and fold as thousands of shard ids pass through a few live ones."""
    if quick:  # the smallest sizes each measurement accepts
        calls, procs, steps, collectors = 20, 2, 100, 6
    if load:
        from ..bench.load import format_load, run_load

        # (quick: still more subscribers than a client's default connection pool holds)
        result = run_load(seconds, slots=(8,), fanout=(120,)) if quick else run_load(seconds)
        click.echo(json.dumps(result, indent=2) if as_json else format_load(result))
        return
    if tree:
        _bench_tree(
            url,
            collectors,
            seconds,
            loopback_cluster,
            announce_every,
            not unsplit,
            not shard_clients,
            one_primary,
            as_json,
        )
        return
    if churn:
        from ..bench.churn import format_churn, run_churn

        result = run_churn(ids=200, live=8, grace_s=0.5, folds=3) if quick else run_churn()
        click.echo(json.dumps(result, indent=2) if as_json else format_churn(result))
        return
    if instructions and fleet:
        from ..bench.instructions import format_fleet_table, run_fleet_instructions

        result = (
            run_fleet_instructions(slots=(4, 64), folds=3, rate_folds=20, value_slots=(4, 64))
            if quick
            else run_fleet_instructions()
        )
        click.echo(json.dumps(result, indent=2) if as_json else format_fleet_table(result))
        return
    if instructions:
        from ..bench.instructions import format_table, run_instructions

        result = (
            run_instructions(sizes=(64, 1024), slots=(1, 4), folds=3, client_publishes=20)
            if quick
            else run_instructions()
        )
        click.echo(json.dumps(result, indent=2) if as_json else format_table(result))
        return
    if peers or everything:
        needs("peers")
    from ..bench.core import run_all

    connected(url)
    if (peers or scale or everything) and url is None:
        raise click.UsageError("--peers, --scale and --all need a Redis (--url or REDISYNC_URL)")
    if everything and as_json:
        assert url is not None  # (refused above)
        from ..bench.peers import run_peers
        from ..bench.scale import run_scale

        doc = {
            "core": run_all(url, calls=calls, procs=procs, seconds=seconds),
            "peers": run_peers(url, steps=steps, scenarios=_peer_scenarios(quick)),
            "scale": run_scale(url, seconds=seconds, **(QUICK_SCALE if quick else {})),
        }
        click.echo(json.dumps(doc, indent=2))
        return
    if peers or everything:
        assert url is not None  # (refused above)
        _bench_peers(url, steps, as_json, show_targets, quick)
    if scale or everything:
        assert url is not None
        _bench_scale(url, seconds, as_json, quick)
    if peers or scale:
        return
    res = run_all(url, calls=calls, procs=procs, seconds=seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"store {res['url']}: PING median {res['ping_us']:.0f} us ({calls} calls per median)")
    rows = []
    for s in res["sizes"]:
        srv = s["server_fold_us"]
        rows.append(
            [
                s["elements"],
                s["slots"],
                f"{s['publish_us']:.0f}",
                f"{s['publish_over_floor']:.2f}",
                f"{s['pull_unchanged_us']:.0f}",
                f"{s['pull_unchanged_over_ping']:.2f}",
                f"{s['pull_changed_us']:.0f}",
                f"{s['pull_changed_over_floor']:.2f}",
                f"{s['pull_changed_polled_us']:.0f}",
                "-" if srv is None else f"{srv:.0f}",
            ]
        )
    click.echo(
        table(
            [
                "N",
                "slots",
                "publish us",
                "x floor",
                "pull same us",
                "x PING",
                "pull changed us",
                "x floor",
                "polled us",
                "server fold us",
            ],
            rows,
        )
    )
    marginal = res["server_fold_ns_per_value"]
    click.echo(
        "(x floor: over the same request to a function that does nothing, in the same run; x PING: over the "
        "median of back-to-back PING series run around each series; pull same: a poll, one read of the version; "
        "pull changed: announced, one call; polled: the read, then the call; server fold: the SLOWLOG median)"
        + ("" if marginal is None else f"\nserver fold, marginal: {marginal:.0f} ns per value (N=1024 to 16384)")
    )
    profile = res["fold_profile_us"]
    if profile.get(64):
        click.echo(
            table(
                ["fold phase (server clock, median)", "N=64 us", "N=1024 us"],
                [[name, f"{profile[64][name]:.0f}", f"{profile[1024][name]:.0f}"] for name in profile[64]],
            )
        )
    c = res["concurrency"]
    if c is None:
        click.echo("concurrency: not measured on the embedded store (each process would have its own); use --url")
    else:
        click.echo(
            f"{c['processes']} publishers, N={c['elements']}: Lua fold {c['lua_publishes_per_s']:.0f}/s, WATCH/MULTI "
            f"{c['watch_publishes_per_s']:.0f}/s ({c['watch_retries']} retries), ratio {c['lua_over_watch']:.2f}x"
        )
    col = res.get("collector")
    if col:
        click.echo(
            f"collector loop: {col['step_ms_sync_off']:.3f} ms/step sync off, {col['step_ms_sync_on']:.3f} ms/step sync on "
            f"({col['overhead_pct_of_step']:+.1f}%); syncer calls median {col['syncer_call_us_median']:.1f} us, "
            f"p99 {col['syncer_call_us_p99']:.0f} us"
        )
        rows = [
            [
                r["device"],
                r["groups"],
                r["bins"],
                f"{r['rebuild_us_kernel1']:.1f}",
                f"{r['rebuild_us_kernel5']:.1f}",
                f"{r['sample_4096_us']:.0f}",
            ]
            for r in res["rebuild"]
        ]
        click.echo(
            table(
                ["device", "groups", "bins per group", "rebuild us (k=1)", "rebuild us (k=5)", "sample 4096 us"], rows
            )
        )
    if not show_targets:
        return
    if res["url"] == EMBEDDED:
        click.echo("(the targets are set for a real Redis on loopback; the embedded store is Python)")
    for name, t in res["targets"].items():
        m = t["measured"]
        click.echo(
            f"target {name}: " + ("not measurable here" if m is None else f"{m:.2f} {'met' if t['met'] else 'MISSED'}")
        )


QUICK_SCALE: dict[str, Any] = {
    "slots": (8, 16),
    "keys_per_report": (1, 4),
    "connections": (4,),
    "memory_cases": ((8, 64, False), (8, 64, True)),
}
"""--scale --quick: each table at two small sizes."""


def _bench_scale(url: str, seconds: float, as_json: bool, quick: bool = False) -> None:
    from ..bench.scale import run_scale

    res = run_scale(url, seconds=seconds, **(QUICK_SCALE if quick else {}))
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo("server time per call (INFO commandstats), one merge key of 1 024 values:")
    click.echo(
        table(
            ["shard slots", "fold us", "pull us"],
            [[r["slots"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fold_vs_slots"]],
        )
    )
    click.echo(
        table(
            ["keys per report (256 values each, 8 slots)", "fold us", "pull us"],
            [[r["keys"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fold_vs_keys"]],
        )
    )
    click.echo(
        table(
            ["shard slots", "fold us (sampler 1024 + normaliser 256)", "pull us"],
            [[r["slots"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fleet_report_vs_slots"]],
        )
    )
    click.echo(
        table(
            ["shards", "values per key", "payloads in the stream", "MB in Redis"],
            [
                [m["slots"], m["elements"], "yes" if m["stream_payloads"] else "no", f"{m['bytes_total'] / 1e6:.2f}"]
                for m in res["memory"]
            ],
        )
    )
    click.echo(
        table(
            ["connections", "publishes/s", "Redis CPU (share of a core)"],
            [
                [t["connections"], f"{t['publishes_per_s']:.0f}", f"{t['redis_cpu_share']:.2f}"]
                for t in res["throughput"]
            ],
        )
    )
    f = res["fleet"]
    click.echo(
        f"fleet: a report every {f['interval_s']:g} s per collector costs Redis "
        + ", ".join(f"{s:.3f} s/s at {n}" for n, s in f["server_s_per_s"].items())
        + f"; the largest fleet within {f['core_budget']:g} of a core: {f['largest_fleet']} collectors"
    )


def _peer_scenarios(quick: bool) -> tuple[Any, ...]:
    """--peers' scenarios; quick: two processes, no straggler (each starts its processes: seconds each)."""
    from ..bench.peers import SCENARIOS

    return tuple(s for s in SCENARIOS if s.procs == 2 and not s.straggler) if quick else SCENARIOS


def _bench_peers(url: str, steps: int, as_json: bool, show_targets: bool, quick: bool = False) -> None:
    from ..bench.peers import run_peers

    res = run_peers(url, steps=steps, scenarios=_peer_scenarios(quick))
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(
        f"{steps} steps per collector, an env step of {res['step_s'] * 1e3:g} ms (sleep), a 64-bin pooled sampler; "
        "blocking time of the sync calls per step, without the straggler's own steps"
    )
    rows = [
        [
            r["scenario"],
            r["procs"],
            "yes" if r["straggler"] else "no",
            f"{r['p50_us']:.1f}",
            f"{r['p99_us']:.0f}",
            f"{r['mean_us']:.1f}",
            r.get("freshness") or "-",
        ]
        for r in res["rows"]
    ]
    click.echo(table(["sync", "processes", "straggler", "p50 us", "p99 us", "mean us", "freshness"], rows))
    rows = [
        [r["scenario"], r["procs"], "yes" if r["straggler"] else "no", f"{r['p50_ratio']:.1f}", f"{r['p99_ratio']:.1f}"]
        for r in res["ratios_over_redisync_process"]
    ]
    click.echo(table(["vs redisync process/step", "processes", "straggler", "p50 ratio", "p99 ratio"], rows))
    rows = [
        [
            r["scenario"],
            r["procs"],
            "yes" if r["straggler"] else "no",
            *(f"{b['share']:.1%} {b['p50_us'] or 0:.0f}/{b['p99_us'] or 0:.0f}" for b in r["breakdown"].values()),
            f"{r['floor_p99_us']:.0f}",
            f"{r['applies_per_s']:.1f}",
            f"{r['applied_lag_versions_p50']}",
        ]
        for r in res["rows"]
        if "breakdown" in r
    ]
    click.echo(
        table(
            [
                "redisync steps: share p50/p99 us",
                "processes",
                "straggler",
                "hand-over",
                "apply",
                "neither",
                "floor p99 us (5 us spin)",
                "applies/s",
                "versions behind (p50)",
            ],
            rows,
        )
    )
    if show_targets:
        for name, t in res["targets"].items():
            click.echo(f"target {name}: {t['measured']:.2f} {'met' if t['met'] else 'MISSED'}")


def _bench_tree(
    url: str | None,
    collectors: int,
    seconds: float,
    loopback: bool,
    window: float,
    split_run: bool,
    syncers: bool,
    one_primary: bool,
    as_json: bool,
) -> None:
    import tempfile

    from ..bench.tree import format_tree, run_tree
    from ..redis_server import loopback_cluster

    if not loopback and (url is None or not url.startswith("redis+cluster://")):
        raise click.UsageError("--tree needs a Redis Cluster: --url redis+cluster://... or --loopback-cluster")
    with contextlib.ExitStack() as stack:
        if loopback:
            url = stack.enter_context(loopback_cluster(stack.enter_context(tempfile.TemporaryDirectory())))
        assert url is not None
        result = run_tree(
            url,
            collectors=collectors,
            seconds=seconds,
            announce_every_s=window,
            split_run=split_run,
            syncers=syncers,
            one_primary=one_primary,
        )
    click.echo(json.dumps(result, indent=2) if as_json else format_tree(result))
