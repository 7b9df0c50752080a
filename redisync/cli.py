"""The ``redisync`` command line: demo, bench and inspect.

Every command takes ``--url`` (default: ``REDISYNC_URL``, else the embedded store). A failure
prints one line naming what went wrong and exits with status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from datetime import datetime, timezone
from typing import Any

import click
import redis

from . import errors
from .client import ENV_URL, EMBEDDED, connect, redis_client
from .keys import ROOT, run_of

URL = click.option("--url", envvar=ENV_URL, default=None, help=f"redis://, rediss:// or unix:// URL (env {ENV_URL}); unset: embedded")


def _when(us: str | None) -> str:
    if not us:
        return "-"
    return datetime.fromtimestamp(int(us) / 1e6, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.group()
def cli() -> None:
    """redisync: one versioned fleet state for every collector of an RL trainer."""


@cli.command()
@URL
@click.option("--shards", default=4, show_default=True, type=click.IntRange(1, 32), help="collector processes")
@click.option("--envs", default=1024, show_default=True, type=click.IntRange(1, 1_000_000), help="envs per collector")
@click.option("--steps", default=15000, show_default=True, type=click.IntRange(200, 10_000_000), help="env steps per run")
@click.option("--bins", default=20, show_default=True, type=click.IntRange(2, 10_000), help="motion length in seconds")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--out", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False), help="folder for demo.png")
@click.option("--no-progress", is_flag=True, help="no progress bar")
def demo(url: str | None, shards: int, envs: int, steps: int, bins: int, seed: int, out_dir: str, no_progress: bool) -> None:
    """A fleet of collector processes with adaptive motion samplers, sync off then on."""
    try:
        from .demo import run_demo
        from .torch.demo_collector import FleetConfig
    except ImportError as e:
        raise errors.RedisyncError(f"the demo needs the demo extra ({e.name} is missing): pip install 'redisync[demo]'") from None

    cfg = FleetConfig(shards=shards, envs=envs, steps=steps, bins=bins, seed=seed, snapshot_every=max(steps // 40, 1))
    click.echo(f"store: {url or 'embedded (served over TCP to the collectors)'}; {shards} collector processes x "
               f"{envs} envs, a {bins} s motion, {steps} steps per run")
    phases = run_demo(url, cfg, Path(out_dir), show_progress=not no_progress)
    for sync in (False, True):
        ph = phases[sync]
        head = f"\nsync {'ON' if sync else 'OFF'}"
        if sync:
            lat = ph.latency_ms
            head += f": fleet version {ph.fleet_version}, {ph.publishes} publishes" + (f", median publish {lat:.2f} ms" if lat else "")
        click.echo(head)
        rows = [[r["shard"], f"{r['tv']:.4f}", f"{r['entropy']:.3f}", r["top1_bin"], f"{r['top1_prob']:.3f}"] for r in ph.rows()]
        click.echo(_table(["shard", "TV from pooled", "entropy", "top-1 bin", "top-1 p"], rows))
        click.echo(f"largest TV distance from the pooled distribution: {max(r['tv'] for r in ph.rows()):.4f}")
    click.echo(f"\nplot: {Path(out_dir) / 'demo.png'}")


@cli.command()
@URL
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--calls", default=1000, show_default=True, type=click.IntRange(10, 10**6), help="calls per median")
@click.option("--procs", default=8, show_default=True, type=click.IntRange(1, 64), help="concurrent publishers")
@click.option("--seconds", default=3.0, show_default=True, type=click.FloatRange(0.1, 600), help="concurrency phase length")
def bench(url: str | None, as_json: bool, calls: int, procs: int, seconds: float) -> None:
    """Latency of PING, publish and pull; server fold time; concurrent throughput vs WATCH/MULTI."""
    from .bench import run_all

    res = run_all(url, calls=calls, procs=procs, seconds=seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"store {res['url']}: PING median {res['ping_us']:.0f} us ({calls} calls per median)")
    rows = []
    for s in res["sizes"]:
        srv = s["server_fold_us"]
        rows.append([s["elements"], f"{s['publish_us']:.0f}", f"{s['publish_over_ping']:.2f}", f"{s['pull_unchanged_us']:.0f}",
                     f"{s['pull_unchanged_over_ping']:.2f}", f"{s['pull_changed_us']:.0f}",
                     "-" if srv is None else f"{srv:.0f}",
                     "-" if srv is None else f"{s['server_ns_per_payload_value']:.0f}"])
    click.echo(_table(["N", "publish us", "x PING", "pull same us", "x PING", "pull changed us", "server fold us", "ns/value"], rows))
    click.echo("(x PING: each call timed beside a PING issued right before it)")
    c = res["concurrency"]
    line = f"{c['processes']} publishers, N={c['elements']}: Lua fold {c['lua_publishes_per_s']:.0f}/s"
    if "watch_publishes_per_s" in c:
        line += f", WATCH/MULTI {c['watch_publishes_per_s']:.0f}/s ({c['watch_retries']} retries), ratio {c['lua_over_watch']:.2f}x"
    click.echo(line)
    col = res.get("collector")
    if col:
        click.echo(f"collector loop: {col['step_ms_sync_off']:.3f} ms/step sync off, {col['step_ms_sync_on']:.3f} ms/step sync on "
                   f"({col['overhead_pct_of_step']:+.1f}%); syncer calls median {col['syncer_call_us_median']:.1f} us, "
                   f"p99 {col['syncer_call_us_p99']:.0f} us")
        rows = [[r["device"], r["bins"], f"{r['rebuild_us_kernel1']:.1f}", f"{r['rebuild_us_kernel5']:.1f}", f"{r['sample_4096_us']:.0f}"]
                for r in res["rebuild"]]
        click.echo(_table(["device", "bins", "rebuild us (k=1)", "rebuild us (k=5)", "sample 4096 us"], rows))
    for name, t in res["targets"].items():
        m = t["measured"]
        click.echo(f"target {name}: " + ("not measurable here" if m is None else f"{m:.2f} {'met' if t['met'] else 'MISSED'}"))


@cli.command()
@URL
@click.option("--run", default=None, help="only this run")
@click.option("--json", "as_json", is_flag=True)
def inspect(url: str | None, run: str | None, as_json: bool) -> None:
    """Runs, keys, versions and writers, stream lengths and dead letters."""
    client = redis_client(url)
    runs = sorted({run_of(k.decode()) for k in client.scan_iter(match=f"{ROOT}:{{*}}:meta", count=1000)} - {None})
    if run is not None:
        if run not in runs:
            raise errors.RunNotFound(f"no run {run!r} at {url or EMBEDDED}")
        runs = [run]
    report = []
    for name in runs:
        store = connect(url, run=name)
        info = store.run_info()
        keys = json.loads(info["schema"])["keys"]
        report.append({
            "run": name,
            "epoch": info["epoch"],
            "fleet_version": int(info["fleet_version"]),
            "updated": _when(info.get("updated_at_us")),
            "reports": store.redis.xlen(store.keys.reports),
            "dead_letters": store.redis.xlen(store.keys.dead_letters),
            "keys": [{"key": k, **{f: v for f, v in store.key_info(k).items() if not f.startswith("slot:")}} for k in keys],
        })
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if not report:
        click.echo(f"no runs at {url or EMBEDDED}")
    for r in report:
        click.echo(f"run {r['run']}  epoch {r['epoch']}  fleet version {r['fleet_version']}  updated {r['updated']}  "
                   f"reports {r['reports']}  dead letters {r['dead_letters']}")
        rows = [[k["key"], k["semantics"], k["shape"], k["version"], k.get("writers", k.get("writer", "-")) or "-",
                 k.get("count", "-"), _when(k.get("updated_at_us"))] for k in r["keys"]]
        click.echo(_table(["key", "semantics", "shape", "version", "writers", "count", "updated"], rows) + "\n")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except (errors.RedisyncError, redis.RedisError, OSError) as e:
        click.echo(f"redisync: error: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
