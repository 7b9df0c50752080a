"""``redisync aggregate``: one run over several primaries (`redisync.aggregation`)."""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

import click

from .. import errors
from ..aggregation import Aggregator, split
from .common import SERVER_URL, connected, not_embedded


@click.command(short_help="Make a run split over several primaries one fleet.")
@SERVER_URL
@click.option("--run", required=True, help="the run its collectors name")
@click.option(
    "--subruns",
    type=click.IntRange(min=1),
    default=None,
    help="split the run into this many sub-runs first, unless it is split already (before its collectors start)",
)
@click.option(
    "--index",
    "indices",
    type=click.IntRange(min=0),
    multiple=True,
    help="the sub-run to aggregate (repeat for several; default: every sub-run)",
)
@click.option("--period", default=0.5, show_default=True, help="seconds between two rounds: the staleness it adds")
def aggregate(url: str | None, run: str, subruns: int | None, indices: tuple[int, ...], period: float) -> None:
    """Fold each sub-run of RUN into the run and write the rest of the run back into it, so that
    every collector, publishing to its shard's sub-run, pulls the whole fleet. Collectors need
    only the URL and the run's name; the learner reads the run itself. Runs until interrupted;
    start one per sub-run (--index) on several hosts, or all in one process."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    url = not_embedded(url, "aggregate")
    store = connected(url, run)
    names = split(store, subruns) if subruns else store.subruns()
    if not names:
        raise click.UsageError(f"run {run!r} is not split: give --subruns to split it")
    chosen = indices or tuple(range(len(names)))
    aggregators = [Aggregator(store.sibling(run), j, period_s=period) for j in chosen]
    click.echo(f"redisync aggregate: run {run!r} as {len(names)} sub-runs: {', '.join(names)}", err=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    failed: list[BaseException] = []

    def aggregating(a: Aggregator) -> None:
        try:
            a.run(done)
        except (errors.ShardInUse, errors.Fenced) as e:  # another aggregator holds, or took, this sub-run
            failed.append(e)
            done.set()

    threads = [
        threading.Thread(target=aggregating, args=(a,), name=f"aggregate-{a.index}", daemon=True) for a in aggregators
    ]
    for thread in threads:
        thread.start()
    with contextlib.suppress(KeyboardInterrupt):
        while not done.wait(1.0):
            if not failed and not all(thread.is_alive() for thread in threads):  # (its error is in the log)
                done.set()
                for thread in threads:
                    thread.join()
                raise click.ClickException(
                    "an aggregator stopped on an unexpected error (above): the run is not aggregated"
                )
    done.set()
    for thread in threads:
        thread.join()
    if failed:  # (exit status 1: a second aggregator of a sub-run is refused, one fenced out stops)
        raise click.ClickException(f"{failed[0]}")
