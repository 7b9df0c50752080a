"""``redisync demo``: a fleet of collector processes, sync off then on, and what it did."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from ..store.client import masked_url
from .common import URL, connected, needs, table


@click.command(short_help="A fleet of collectors, without then with sync.")
@URL
@click.option("--shards", default=4, show_default=True, type=click.IntRange(1, 32), help="collector processes")
@click.option("--envs", default=1024, show_default=True, type=click.IntRange(1, 1_000_000), help="envs per collector")
@click.option(
    "--steps", default=15000, show_default=True, type=click.IntRange(200, 10_000_000), help="env steps per run"
)
@click.option("--bins", default=20, show_default=True, type=click.IntRange(2, 10_000), help="motion length in seconds")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--out", "out_dir", default="out", show_default=True, type=click.Path(file_okay=False), help="folder for demo.png"
)
@click.option(
    "--run", default="demo", show_default=True, help="the synced run's name (the unsynced run writes nothing)"
)
@click.option(
    "--keep", is_flag=True, help="keep the run (always with --url); on the embedded store, serve it until Ctrl-C"
)
@click.option("--no-progress", is_flag=True, help="no progress bar")
def demo(
    url: str | None,
    shards: int,
    envs: int,
    steps: int,
    bins: int,
    seed: int,
    out_dir: str,
    run: str,
    keep: bool,
    no_progress: bool,
) -> None:
    """A fleet of collector processes with adaptive motion samplers, sync off then on."""
    needs("demo")
    from ..demo.collector import FleetConfig
    from ..demo.fleet import run_demo

    keep = keep or url is not None
    if url is not None:
        store = connected(url, run)
        if store.registered():
            raise click.BadParameter(f"{store.url} already holds a run {run!r}: pick another --run", param_hint="--run")
    cfg = FleetConfig(shards=shards, envs=envs, steps=steps, bins=bins, seed=seed, snapshot_every=max(steps // 40, 1))

    def started(target: str) -> None:
        where = "embedded, served over TCP to the collectors" if url is None else "your Redis"
        click.echo(
            f"demo: run {run!r} at {masked_url(target)} ({where}); {shards} collector processes x {envs} envs, "
            f"a {bins} s motion, {steps} steps per run, first without sync (nothing written), then with it"
        )

    def done(target: str, phases: dict[bool, Any]) -> None:
        for sync in (False, True):
            ph = phases[sync]
            head = f"\nsync {'ON' if sync else 'OFF'}"
            if sync:
                lat = ph.latency_ms
                head += f": fleet version {ph.fleet_version}, {ph.publishes} publishes" + (
                    f", median publish {lat:.2f} ms" if lat else ""
                )
            click.echo(head)
            if sync and ph.unpublished:
                click.echo(f"warning: the last report of collectors {ph.unpublished} did not reach the store at stop()")
            rows = [
                [r["shard"], f"{r['tv']:.4f}", f"{r['entropy']:.3f}", r["top1_bin"], f"{r['top1_prob']:.3f}"]
                for r in ph.rows()
            ]
            click.echo(table(["shard", "TV from pooled", "entropy", "top-1 bin", "top-1 p"], rows))
            click.echo(f"largest TV distance from the pooled distribution: {max(r['tv'] for r in ph.rows()):.4f}")
        click.echo(f"\nplot: {Path(out_dir) / 'demo.png'}")
        if not keep:
            click.echo(
                f"run {run!r} was deleted with the embedded store; to look at it, run the demo with --keep "
                "(it then serves the run until Ctrl-C) or with --url redis://..."
            )
            return
        click.echo(f"run {run!r} kept at {masked_url(target)}; look at it with:")
        for line in follow_up(target, run):
            click.echo(f"  {line}")
        if url is None:
            click.echo("the embedded store lives in this process: it serves the run until you press Ctrl-C")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                click.echo("stopped")

    run_demo(url, cfg, Path(out_dir), run, keep, show_progress=not no_progress, on_start=started, on_done=done)


def follow_up(url: str, run: str) -> list[str]:
    """The commands that show a kept run, to paste as printed: a URL with a password is not printed
    (a masked one would fail when pasted), the commands read it from ``REDISYNC_URL``."""
    if masked_url(url) == url:
        return inspect_commands(url, run)
    return [
        *inspect_commands('"$REDISYNC_URL"', run),
        f"(with REDISYNC_URL set to the run's URL: {masked_url(url)} with its password)",
    ]


def this_cli() -> str:
    """This redisync as a fresh shell can call it: its full path when it lives in a virtual
    environment (a fresh shell has not activated it), else ``redisync``."""
    script = Path(sys.executable).parent / "redisync"
    if sys.prefix != sys.base_prefix and script.exists():
        return str(script)
    return "redisync" if shutil.which("redisync") else f"{sys.executable} -m redisync.cli"


def inspect_commands(url: str, run: str) -> list[str]:
    """The commands that show a run: redisync's inspect and watch, and redis-cli on its keys."""
    cli = this_cli()
    return [
        f"{cli} inspect --url {url} --run {run}",
        f"{cli} watch --url {url} --run {run}",
        f"redis-cli -u {url} --scan --pattern 'redisync:{{{run}}}:*'",
    ]
