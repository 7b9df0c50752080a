"""``redisync watch``: a live view of one run.

Per shard: how long ago its last report was folded, how many fleet versions made before that
report it had not seen, and — for each distribution it samples from (a pooled merge key: a failure EMA, a
histogram) — the distance of what it *samples* from the pooled distribution beside the distance
it would have *without sync* (its own slot alone). Above the table, a short history of the
version rate and of the worst distances. In a terminal the view redraws in place; piped, it
prints one frame per refresh.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from .. import errors
from ..inspection import SampledDistance, ServiceWatch, drift, measured_drift, shard_leases, shard_reports
from ..store.client import ServerError, masked_url
from .common import SERVER_URL, age, cli_connect, not_embedded, num, render, rich_table, terminal

SPARKS = "▁▂▃▄▅▆▇█"
HISTORY = 40  # refreshes kept for the sparklines
BEHIND_WARN = 10  # fleet versions behind at its last report: a shard this far back is shown in yellow


def sparkline(values: list[float | None], top: float | None = None) -> str:
    """``values`` as block characters scaled to ``top`` (default: their maximum); a refresh without a
    value (None) is a blank, not the lowest block (which would read as zero)."""
    known = [v for v in values if v is not None]
    if not known:
        return " " * len(values)
    top = max(known) if top is None else top

    def block(v: float | None) -> str:
        if v is None:
            return " "
        return SPARKS[0] if top <= 0 else SPARKS[min(len(SPARKS) - 1, int(v / top * (len(SPARKS) - 1) + 0.5))]

    return "".join(block(v) for v in values)


def scaled(label: str, values: list[float | None], top: float, unit: str = "") -> str:
    """A labelled sparkline with its range, so that a reader knows what the tallest block means."""
    return f"{label:<20}{sparkline(values, top)}  0 to {top:.3g}{unit}"


@dataclass
class WatchState:
    """What the view remembers between refreshes."""

    sampled: SampledDistance = field(default_factory=SampledDistance)
    last: tuple[float, int, int] | None = None  # (monotonic time, fleet version, dead letters)
    epoch: str | None = None  # the run's epoch: a run lost and registered again starts its history over
    rates: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    worst_sampled: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY))
    worst_unsynced: deque[float | None] = field(default_factory=lambda: deque(maxlen=HISTORY))
    legend_shown: bool = False  # printed frames (a pipe) carry the legend once
    service: ServiceWatch = field(default_factory=ServiceWatch)  # the server seen serving: a dead fleet lapses

    def start_over(self, epoch: str) -> None:
        """A new epoch: its versions start over, so its history does too."""
        self.__dict__.update(WatchState(epoch=epoch).__dict__)


def frame(store: Any, url: str, state: WatchState, compact: bool = False) -> Group:
    """One refresh of the view, read from the store. ``compact`` (a terminal): short column headers,
    the keys named in a line below, so that the view fits 80 columns; printed frames (a pipe) carry
    full headers and the legend once."""
    t = time.monotonic()
    info = store.run_info()
    if not info.get("epoch") or not info.get("fleet_version", "").isdigit():
        raise errors.RunNotFound(f"run {store.run!r} is not registered")
    if info["epoch"] != state.epoch:  # (the first frame, or the run was lost and registered again)
        state.start_over(info["epoch"])
    version = int(info["fleet_version"])
    dead = store.dead_letter_count()
    last = state.last
    rate = (version - last[1]) / (t - last[0]) if last else 0.0
    new_dead = dead - last[2] if last else 0
    state.last = (t, version, dead)
    reports, drifts, leases = shard_reports(store), drift(store), shard_leases(store, state.service)
    state.sampled.observe(version, drifts)
    measured = measured_drift(store)  # (observing shards: the drift each measured with its sampler's formulas)

    headers = ["shard", "last report", "behind", "lease"]
    tags = {name: f"{i}" for i, name in enumerate(drifts, 1)}
    for name, d in drifts.items():
        if compact:
            tag = tags[name]
            headers += [f"mean off{tag}"] if d["kind"] == "moments" else [f"TV{tag} smp", f"TV{tag} own", f"H{tag}"]
        elif d["kind"] == "moments":
            headers.append(f"{name} |mean offset| (pooled sd)")
        else:
            headers += [f"{name} TV sampling", f"{name} TV without sync", f"{name} entropy"]
        if name in measured:
            headers.append(f"TV{tags[name]} obs" if compact else f"{name} TV measured")
    rows, sampled_tvs, unsynced_tvs = [], [], []
    for shard in sorted(reports):
        seen, behind = reports[shard]["seen"], reports[shard]["behind"]
        lease = leases.get(shard, "-")
        row: list[Any] = [
            shard,
            age(reports[shard]["age_s"]),
            Text("-" if behind is None else str(behind), style="yellow" if (behind or 0) >= BEHIND_WARN else ""),
            Text(lease, style="yellow" if lease in ("lapsed", "aborted") else "dim" if lease == "stopped" else ""),
        ]
        for name, d in drifts.items():
            s = d["shards"].get(shard)
            if d["kind"] == "moments":
                row.append("-" if s is None else num(s["offset_sd"], 2))
                continue
            sampled = state.sampled.distance(name, shard, seen, drifts)
            if sampled is not None:
                sampled_tvs.append(sampled)
            if s is not None:
                unsynced_tvs.append(s["tv"])
            row += [
                Text("-" if sampled is None else num(sampled, 4), style="green"),
                "-" if s is None else num(s["tv"], 4),
                "-" if s is None else num(s["entropy"], 3),
            ]
            if name in measured:
                row.append("-" if shard not in measured[name] else num(measured[name][shard], 4))
        rows.append(row)
    state.rates.append(rate)
    state.worst_sampled.append(max(sampled_tvs, default=None))
    state.worst_unsynced.append(max(unsynced_tvs, default=None))
    finished = bool(leases) and all(held == "stopped" for held in leases.values())

    parts: list[Any] = [
        Text.assemble((f"run {store.run}", "bold"), f" at {masked_url(url)}   {time.strftime('%H:%M:%S')}"),
        Text.assemble(
            f"fleet version {version}   {rate:.1f} versions/s   ",
            (f"rejected reports {dead} (+{new_dead})", "red" if new_dead else ""),
        ),
    ]
    if finished:
        parts.append(Text("finished: every collector stopped and gave its lease up", style="bold"))
    elif bool(leases) and all(held in ("stopped", "aborted") for held in leases.values()):
        parts.append(
            Text(
                "ended without finishing: every collector has stopped, "
                f"{sum(held == 'aborted' for held in leases.values())} of them because the trainer that started "
                "it died or it was sent SIGTERM",
                style="bold red",
            )
        )
    parts += ["", rich_table(headers, rows) if rows else Text("no shard has reported yet", style="dim")]
    if compact and drifts:
        parts.append(Text("   ".join(f"{tags[name]}: {name}" for name in drifts), style="dim"))
    if any(d["kind"] == "distribution" for d in drifts.values()):
        top = max([v for v in (*state.worst_unsynced, *state.worst_sampled) if v is not None] or [0.0])
        parts += [
            "",
            Text(scaled("versions/s", list(state.rates), max(state.rates, default=0.0))),
            Text(scaled("worst TV sampling", list(state.worst_sampled), top), style="green"),
            Text(scaled("worst TV w/o sync", list(state.worst_unsynced), top)),
        ]
        if compact or not state.legend_shown:
            state.legend_shown = True
            parts.append(
                Text(
                    "TV sampling: the distance from the pooled distribution of what the shard samples (the fleet "
                    "state it had seen at its last report, judged from the states this view recorded: '-' until one "
                    "is, and for ever in a view started after the run finished: it never saw the states they had seen). TV without sync: its own slot alone, what it would sample "
                    "unsynced. TV measured: what an observing shard measured itself with its sampler's formulas (its "
                    "distribution against the pooled one at its last report, the drift its metrics report). behind: the fleet versions made before its last report that it had not seen. "
                    "lease: live, lapsed (it stopped renewing without a clean stop), stopped, or aborted (given up as "
                    "its trainer died or it was sent SIGTERM).",
                    style="dim",
                )
            )
        for name, d in drifts.items():
            if d["kind"] == "distribution":
                parts.append(Text(f"pooled entropy of {name}: {num(d['pooled_entropy'], 3)}", style="dim"))
    return Group(*parts)


@click.command(short_help="A live view of one run, shard by shard.")
@SERVER_URL
@click.option("--run", required=True, help="the run to watch")
@click.option(
    "--interval", default=1.0, show_default=True, type=click.FloatRange(0.05, 3600), help="seconds between refreshes"
)
@click.option(
    "--count",
    default=0,
    type=click.IntRange(0),
    help="stop after this many refreshes (0: until Ctrl-C); exit 1 when the last one could not show the run",
)
def watch(url: str | None, run: str, interval: float, count: int) -> None:
    """A live view of one run: per shard its report age, how far behind it was, and the distance of
    what it samples from the pooled distribution beside its distance without sync. Started before
    the run exists (beside a training about to start), it waits for it; a store that restarts or
    cannot be reached, a run lost and registered again: it says what it waits for and carries on."""
    url = not_embedded(url, "watch")
    state, shown = WatchState(), 0
    live: Live | None = None
    store = cli_connect(url, run)
    said: str | None = None  # what it last said it waits for (said once, not at every refresh)
    try:
        if terminal():
            live = Live(console=Console(highlight=False), auto_refresh=False, transient=False)
            live.start()
        while True:
            t = time.monotonic()
            try:
                view: Any = frame(store, url, state, compact=live is not None)
                said = None
            except (errors.RunNotFound, errors.ConnectionUnavailable, errors.PermissionDenied, ServerError) as e:
                waiting = waiting_for(e, run, url, state)
                if waiting != said:
                    said = waiting
                    if live is None:
                        click.echo(f"{time.strftime('%H:%M:%S')} {waiting} (Ctrl-C to stop)")
                store = cli_connect(url, run)  # (a run registered again may hold another schema)
                view = Text(f"{time.strftime('%H:%M:%S')} {waiting} (Ctrl-C to stop)", style="yellow")
                if live is None:
                    view = None
            if live is not None:
                live.update(view, refresh=True)
            elif view is not None:
                click.echo(render(view) + "\n")
            shown += 1
            if count and shown >= count:
                if said is not None:  # its last refresh showed nothing of the run: not a success
                    raise errors.RedisyncError(f"{said}, after {count} refreshes")
                return
            time.sleep(max(0.0, interval - (time.monotonic() - t)))
    except KeyboardInterrupt:
        click.echo("\nstopped")
    finally:
        if live is not None:
            live.stop()


def waiting_for(error: BaseException, run: str, url: str, state: WatchState) -> str:
    """What the view waits for, in one line: the run to be registered (again), or the store."""
    if isinstance(error, errors.RunNotFound):
        if state.epoch is None:
            return f"waiting for run {run!r} at {masked_url(url)} to be registered"
        return f"run {run!r} is gone from {masked_url(url)} (the store restarted without it?): waiting for it to be registered again"
    if isinstance(error, errors.RedisyncError):  # (its message names the URL, masked)
        return f"waiting for the store: {error}"
    return f"waiting for the store at {masked_url(url)}: {error}"
