"""``redisync watch``: a live view of one run."""

from __future__ import annotations

import sys
import time

import click

from ..inspection import drift, shard_ages
from ..store.client import masked_url
from .common import SERVER_URL, age, not_embedded, num, table, wait_for_run


@click.command()
@SERVER_URL
@click.option("--run", required=True, help="the run to watch")
@click.option(
    "--interval", default=1.0, show_default=True, type=click.FloatRange(0.05, 3600), help="seconds between refreshes"
)
@click.option("--count", default=0, type=click.IntRange(0), help="stop after this many refreshes (0: until Ctrl-C)")
def watch(url: str | None, run: str, interval: float, count: int) -> None:
    """A live view of one run: version rate, per-shard staleness and drift, rejected reports. Started
    before the run exists (watching a training about to start), it waits for it."""
    url = not_embedded(url, "watch")
    last: tuple[float, int, int] | None = None
    shown = 0
    try:
        store = wait_for_run(url, run, interval)
        while True:
            t = time.monotonic()
            info = store.run_info()
            version, dead = int(info["fleet_version"]), int(store.redis.xlen(store.keys.dead_letters))
            rate = (version - last[1]) / (t - last[0]) if last else 0.0
            new_dead = dead - last[2] if last else 0
            last = (t, version, dead)
            ages, drifts = shard_ages(store), drift(store)
            lines = [
                f"run {run} at {masked_url(url)}   {time.strftime('%H:%M:%S')}",
                f"fleet version {version}   {rate:.1f} versions/s   rejected reports {dead} (+{new_dead})",
                "",
            ]
            rows = []
            for shard in sorted(ages):
                row = [shard, age(ages[shard])]
                for d in drifts.values():
                    s = d["shards"].get(shard)
                    if d["kind"] == "moments":
                        row += ["-" if s is None else num(s["offset_sd"], 2)]
                    else:
                        row += ["-", "-"] if s is None else [num(s["tv"], 4), num(s["entropy"], 3)]
                rows.append(row)
            headers = ["shard", "last report"]
            for name, d in drifts.items():
                headers += (
                    [f"{name} |mean offset| (pooled sd)"] if d["kind"] == "moments" else [f"{name} TV", "entropy"]
                )
            lines.append(table(headers, rows) if rows else "no shard has reported yet")
            for name, d in drifts.items():
                if d["kind"] == "distribution":
                    lines.append(f"pooled entropy of {name}: {num(d['pooled_entropy'], 3)}")
            click.echo(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + "\n".join(lines), nl=True)
            shown += 1
            if count and shown >= count:
                return
            time.sleep(max(0.0, interval - (time.monotonic() - t)))
    except KeyboardInterrupt:
        click.echo("\nstopped")
