"""``redisync inspect``, ``snapshot`` and ``restore``: a run's state in a Redis, read, saved and put back."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import click

from .. import errors
from ..inspection import describe_run, describe_runs, shard_leases
from ..store.client import RunSnapshot, masked_url
from .common import SERVER_URL, age, connected, not_embedded, read_snapshot, run_store, table


@click.command(short_help="Show runs, keys, slots and dead letters.")
@SERVER_URL
@click.option("--run", default=None, help="only this run")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def inspect(url: str | None, run: str | None, as_json: bool) -> None:
    """Runs, keys, specs, versions, slots, stream lengths and dead letters."""
    url = not_embedded(url, "inspect")
    if run is not None:
        report = [describe_run(run_store(url, run))]
    else:
        report, skipped = describe_runs(connected(url), lambda name: run_store(url, name))
        for key, why in skipped:
            click.echo(f"skipped {key}: {why}", err=True)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if not report:
        click.echo(f"no runs at {masked_url(url)}")
    for r in report:
        click.echo(
            f"run {r['run']}  epoch {r['epoch']}  fleet version {r['fleet_version']}  updated {age(r['updated_age_s'])} ago  "
            f"reports {r['reports']}  dead letters {r['dead_letters']}"
        )
        quiet = r.get("quiet_s")
        if quiet is not None and quiet > r["stall_cap_s"] and "live" in r["leases"].values():
            click.echo(
                f"no collector has called this run for {age(quiet)}: its leases read live in the run's own clock, "
                "which only the collectors' calls advance, so one reading cannot tell a dead fleet from a stalled "
                "server ('redisync watch' can, within a few seconds)"
            )
        rows = []
        for k in r["keys"]:
            who = ",".join(str(s["shard"]) for s in k["slots"]) if "slots" in k else (k.get("writer") or "-")
            spec = (
                f"stale {k['stale_after_s']}s"
                if k.get("stale_after_s")
                else (f"owner {k['owner']}" if k.get("owner") is not None else "")
            )
            rows.append(
                [
                    k["key"],
                    k["semantics"],
                    "x".join(map(str, k["shape"])) or "scalar",
                    spec,
                    k["version"],
                    who or "-",
                    f"{k['count']:g}" if "count" in k else "-",
                    age(k["updated_age_s"]),
                ]
            )
        click.echo(table(["key", "semantics", "shape", "spec", "version", "writers", "count", "updated"], rows))
        for k in r["keys"]:
            if "slots" not in k:
                continue
            held = {str(s["shard"]) for s in k["slots"]}
            missing = sorted((s for s in r["leases"] if s not in held), key=int)
            if missing:
                who = ", ".join(f"{s} ({r['leases'][s]})" for s in missing)
                click.echo(
                    f"{k['key']}: no slot for shard {who}: "
                    + (
                        "a state key drops the slot of a shard that stopped, was aborted, lapsed or went stale"
                        if k.get("lifecycle") == "state"
                        else "a history key keeps a slot once written until its shard has been gone for its "
                        "retire_after_s (then retired: still counted): these shards have not reported it, or "
                        "left that long ago"
                    )
                )
        slots = [
            [
                k["key"],
                s["shard"],
                s["incarnation"],
                s["seq"],
                age(s["age_s"]),
                f"{s['count']:g}",
                "stale: dropped at the next fold" if s["stale"] else "live",
                r["leases"].get(str(s["shard"]), "-"),
            ]
            for k in r["keys"]
            for s in k.get("slots", [])
        ]
        if slots:
            headers = ["slot of key", "shard", "incarnation", "seq", "age", "count", "state", "lease"]
            click.echo("\n" + table(headers, slots))
        for d in r["newest_dead_letters"]:
            click.echo(
                f"dead letter {d['id']}: shard {d.get('shard')} {d.get('reason')} {d.get('key') or ''} - {d.get('detail')}"
            )
        click.echo("")


@click.command(short_help="Save a run's whole state to a file.")
@SERVER_URL
@click.option("--run", required=True, help="the run to save")
@click.argument("path", type=click.Path(dir_okay=False))
def snapshot(url: str | None, run: str, path: str) -> None:
    """Save a run's whole state to PATH (JSON, format redisync.snapshot v1)."""
    snap = run_store(not_embedded(url, "snapshot"), run).snapshot()
    try:
        Path(path).write_text(snap.model_dump_json(indent=1))
    except OSError as e:
        raise errors.RedisyncError(f"{path}: cannot write the snapshot there ({e.strerror})") from None
    click.echo(f"saved run {run} (fleet version {_fleet_version(snap)}) to {path}")


@click.command(short_help="Restore a run from a snapshot, under a new epoch.")
@SERVER_URL
@click.option("--run", required=True, help="the run to replace (may differ from the saved run's name)")
@click.argument("path", type=click.Path(dir_okay=False))
def restore(url: str | None, run: str, path: str) -> None:
    """Replace a run's state by the snapshot in PATH, under a new epoch."""
    url = not_embedded(url, "restore")
    snap = read_snapshot(path)
    store = connected(url, run)
    try:
        epoch = store.restore(snap)
    except errors.CorruptSnapshot as e:
        raise errors.CorruptSnapshot(f"{path}: {e}") from None
    click.echo(f"restored run {run} from {path} (saved from run {snap.run}); new epoch {epoch}")


@click.command(short_help="Delete a finished run from the store.")
@SERVER_URL
@click.option("--run", required=True, help="the run to delete")
@click.option("--force", is_flag=True, help="delete it even while a collector's lease on it is live")
def delete(url: str | None, run: str, force: bool) -> None:
    """Delete every key of a run: its fleet state, streams, leases and history (a finished or abandoned
    run, whose lapsed or aborted shards would otherwise keep an alert firing). Refused while a
    collector's lease on it is live, unless --force; save it first with 'redisync snapshot' to keep it."""
    store = run_store(not_embedded(url, "delete"), run)
    live = sorted(shard for shard, state in shard_leases(store).items() if state == "live")
    if live and not force:
        raise errors.ConfigurationError(
            f"run {run!r} has live collectors (shards {', '.join(map(str, live))}): stop them first, or pass --force"
        )
    store.delete()
    click.echo(f"deleted run {run}")


def _fleet_version(snap: RunSnapshot) -> int:
    return int(base64.b64decode(snap.hashes["meta"]["fleet_version"]))
