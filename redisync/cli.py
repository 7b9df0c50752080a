"""The ``redisync`` command line: demo, ab (the study), bench, and inspect, watch, snapshot, restore.

Every command takes ``--url`` (default: ``REDISYNC_URL``, else the embedded store; the commands on
a run refuse to start without one). A failure prints one line naming what went wrong and exits with
status 1; a missing extra is named before any work.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
import redis
from pydantic import ValidationError

from . import __version__, errors
from .inspection import describe_run, describe_runs, drift, shard_ages
from .store.client import EMBEDDED, ENV_URL, RunSnapshot, connect, masked_url

URL = click.option(
    "--url",
    envvar=ENV_URL,
    default=None,
    help=f"redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL (env {ENV_URL}); unset: embedded",
)
SERVER_URL = click.option(
    "--url",
    envvar=ENV_URL,
    default=None,
    help=f"the Redis that holds the run: redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL "
    f"(env {ENV_URL}; required: the embedded store would start empty)",
)
EXTRAS = {
    "demo": ("torch", "tqdm", "matplotlib"),
    "study": ("torch", "tqdm", "matplotlib", "scipy", "gymnasium"),
    "peers": ("torch",),
}


def _needs(what: str) -> None:
    """Before any work: the modules a command needs, or one line saying which extra brings them."""
    missing = [m for m in EXTRAS[what] if not _importable(m)]
    if missing:
        extra = {"peers": "torch", "study": "study"}.get(what, "demo")
        raise errors.RedisyncError(
            f"redisync {what if what != 'study' else 'ab'} needs the {extra} extra "
            f"({', '.join(missing)} missing): pip install 'redisync[{extra}]'"
        )


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _not_embedded(url: str | None, command: str) -> str:
    """A command that reads or writes a run needs a Redis: the embedded store starts empty and is gone at exit."""
    if url is None:
        raise click.UsageError(
            f"{command} works on a run in a Redis: pass --url or set {ENV_URL} "
            "(the embedded store would start empty and be gone when this command exits)"
        )
    return url


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@click.group()
@click.version_option(__version__, prog_name="redisync")
def cli() -> None:
    """redisync: one versioned fleet state for every collector of an RL trainer."""


@cli.command()
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
    _needs("demo")
    from .demo.collector import FleetConfig
    from .demo.fleet import inspect_commands, run_demo

    keep = keep or url is not None
    if url is not None:
        store = _connected(url, run)
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
            click.echo(_table(["shard", "TV from pooled", "entropy", "top-1 bin", "top-1 p"], rows))
            click.echo(f"largest TV distance from the pooled distribution: {max(r['tv'] for r in ph.rows()):.4f}")
        click.echo(f"\nplot: {Path(out_dir) / 'demo.png'}")
        if not keep:
            click.echo(
                f"run {run!r} was deleted with the embedded store; to look at it, run the demo with --keep "
                "(it then serves the run until Ctrl-C) or with --url redis://..."
            )
            return
        click.echo(f"run {run!r} kept at {masked_url(target)}; look at it with:")
        for command in inspect_commands(masked_url(target), run):
            click.echo(f"  {command}")
        if url is None:
            click.echo("the embedded store lives in this process: it serves the run until you press Ctrl-C")
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                click.echo("stopped")

    run_demo(url, cfg, Path(out_dir), run, keep, show_progress=not no_progress, on_start=started, on_done=done)


@cli.command()
@URL
@click.option("--json", "as_json", is_flag=True, help="print the figures as JSON")
@click.option("--calls", default=1000, show_default=True, type=click.IntRange(10, 10**6), help="calls per median")
@click.option("--procs", default=8, show_default=True, type=click.IntRange(1, 64), help="concurrent publishers")
@click.option(
    "--seconds", default=3.0, show_default=True, type=click.FloatRange(0.1, 600), help="concurrency phase length"
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
    "--all",
    "everything",
    is_flag=True,
    help="the core figures, --peers and --scale in one run (with --json: one document)",
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
    everything: bool,
) -> None:
    """Latency of PING, publish and pull; server fold time; concurrent throughput vs WATCH/MULTI.
    With --peers: the collector's blocking time per step, redisync's workers beside gloo collectives.
    With --scale: how the server's cost grows with the fleet, and the largest fleet one Redis serves."""
    if instructions:
        from .bench.instructions import format_table, run_instructions

        result = run_instructions()
        click.echo(json.dumps(result, indent=2) if as_json else format_table(result))
        return
    if peers or everything:
        _needs("peers")
    from .bench.core import run_all

    _connected(url)
    if (peers or scale or everything) and url is None:
        raise click.UsageError("--peers, --scale and --all need a Redis (--url or REDISYNC_URL)")
    if everything and as_json:
        assert url is not None  # (refused above)
        from .bench.peers import run_peers
        from .bench.scale import run_scale

        doc = {
            "core": run_all(url, calls=calls, procs=procs, seconds=seconds),
            "peers": run_peers(url, steps=steps),
            "scale": run_scale(url, seconds=seconds),
        }
        click.echo(json.dumps(doc, indent=2))
        return
    if peers or everything:
        assert url is not None  # (refused above)
        _bench_peers(url, steps, as_json)
    if scale or everything:
        assert url is not None
        _bench_scale(url, seconds, as_json)
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
        _table(
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
            _table(
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
            _table(
                ["device", "groups", "bins per group", "rebuild us (k=1)", "rebuild us (k=5)", "sample 4096 us"], rows
            )
        )
    if res["url"] == EMBEDDED:
        click.echo("(the targets are set for a real Redis on loopback; the embedded store is Python)")
    for name, t in res["targets"].items():
        m = t["measured"]
        click.echo(
            f"target {name}: " + ("not measurable here" if m is None else f"{m:.2f} {'met' if t['met'] else 'MISSED'}")
        )


def _bench_scale(url: str, seconds: float, as_json: bool) -> None:
    from .bench.scale import run_scale

    res = run_scale(url, seconds=seconds)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    click.echo("server time per call (INFO commandstats), one merge key of 1 024 values:")
    click.echo(
        _table(
            ["shard slots", "fold us", "pull us"],
            [[r["slots"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fold_vs_slots"]],
        )
    )
    click.echo(
        _table(
            ["keys per report (256 values each, 8 slots)", "fold us", "pull us"],
            [[r["keys"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fold_vs_keys"]],
        )
    )
    click.echo(
        _table(
            ["shard slots", "fold us (sampler 1024 + normaliser 256)", "pull us"],
            [[r["slots"], f"{r['fold_us']:.0f}", f"{r['pull_us']:.0f}"] for r in res["fleet_report_vs_slots"]],
        )
    )
    click.echo(
        _table(
            ["shards", "values per key", "payloads in the stream", "MB in Redis"],
            [
                [m["slots"], m["elements"], "yes" if m["stream_payloads"] else "no", f"{m['bytes_total'] / 1e6:.2f}"]
                for m in res["memory"]
            ],
        )
    )
    click.echo(
        _table(
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


def _bench_peers(url: str, steps: int, as_json: bool) -> None:
    from .bench.peers import run_peers

    res = run_peers(url, steps=steps)
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
    click.echo(_table(["sync", "processes", "straggler", "p50 us", "p99 us", "mean us", "freshness"], rows))
    rows = [
        [r["scenario"], r["procs"], "yes" if r["straggler"] else "no", f"{r['p50_ratio']:.1f}", f"{r['p99_ratio']:.1f}"]
        for r in res["ratios_over_redisync_process"]
    ]
    click.echo(_table(["vs redisync process/step", "processes", "straggler", "p50 ratio", "p99 ratio"], rows))
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
        _table(
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
    for name, t in res["targets"].items():
        click.echo(f"target {name}: {t['measured']:.2f} {'met' if t['met'] else 'MISSED'}")


@cli.command()
@URL
@click.option(
    "--out",
    "out_dir",
    default="out/ab",
    show_default=True,
    type=click.Path(file_okay=False),
    help="folder for results.json, the plots and report.md (the committed study: --out docs/ab)",
)
@click.option(
    "--seeds", default=8, show_default=True, type=click.IntRange(2, 1000), help="seeds per arm of the primary contrasts"
)
@click.option(
    "--secondary-seeds",
    default=3,
    show_default=True,
    type=click.IntRange(2, 1000),
    help="seeds per arm of the secondary (descriptive) contrasts",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 256), help="runs trained side by side")
@click.option("--smoke", is_flag=True, help="the small CI configuration (minutes, not an hour)")
@click.option("--gate-only", is_flag=True, help="run the gate (single vs uniform on H) and stop")
@click.option(
    "--follow-up",
    is_flag=True,
    help="after the gate, the pre-registered follow-up (P1-P4, docs/ab/follow-up-plan.md) instead of the study",
)
@click.option(
    "--env-steps", default=None, type=click.IntRange(1_000), help="env steps per run (default: the configuration's)"
)
@click.option(
    "--env", "env_spec", default=None, help="'module:function' making your own TrackingEnv batches (see README)"
)
@click.option("--report-only", is_flag=True, help="rebuild the plots and report.md from OUT/results.json")
@click.option("--no-progress", is_flag=True, help="no progress bar")
def ab(
    url: str | None,
    out_dir: str,
    seeds: int,
    secondary_seeds: int,
    workers: int,
    smoke: bool,
    gate_only: bool,
    follow_up: bool,
    env_steps: int | None,
    env_spec: str | None,
    report_only: bool,
    no_progress: bool,
) -> None:
    """The drift study: the gate, then every sync arm on H and X trained with SAC; figures and report in OUT."""
    _needs("study")
    from .study.fleet import StudyConfig
    from .study.report import write_report
    from .study.study import load_env_factory, run_study

    out = Path(out_dir)
    command = "redisync " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["ab"] else "redisync ab"
    if report_only:
        try:
            results = json.loads((out / "results.json").read_text())
        except (OSError, ValueError) as e:
            raise click.BadParameter(f"{out / 'results.json'}: {e}", param_hint="--out") from None
        click.echo(f"report: {write_report(results, out, results.get('command', command))}")
        return
    cfg = StudyConfig().smoke() if smoke else StudyConfig()
    if env_steps is not None:
        cfg = replace(cfg, env_steps=env_steps)
    try:
        load_env_factory(env_spec, cfg)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--env") from None
    click.echo(f"{cfg.env_steps:,} env steps per run, {workers} workers; store: {url or 'embedded (one per worker)'}")
    results = run_study(
        cfg,
        primary_seeds=seeds,
        secondary_seeds=min(secondary_seeds, seeds),
        url=url,
        env_spec=env_spec,
        workers=workers,
        show_progress=not no_progress,
        gate_only=gate_only,
        follow_up=follow_up,
        on_stage=click.echo,
    )
    results["command"] = command
    report = write_report(results, out, command)
    g = results["gate"]
    click.echo(
        f"gate: single - uniform = {g['mean_difference']:+.3f} (needs >= {g['threshold']}): "
        f"{'passed' if g['passed'] else 'FAILED'}"
    )
    for h in results.get("follow_up") or []:
        verdict = ("rejected: " if h["rejected"] else "not rejected: ") if h["tested"] else "not tested (descriptive): "
        click.echo(f"{h['name']} {h['contrast']}: {h['mean']:+.3f}, one-sided p {h['p_one_sided']:.3g}; {verdict}"
                   f"{h['decision']}")  # fmt: skip
    if results["analysis"]:
        rows = [
            [
                c["name"],
                f"{c['mean']:+.3f}",
                f"[{c['lo']:+.3f}, {c['hi']:+.3f}]",
                f"{c['p_holm']:.3g}",
                f"{c['p_equivalence_holm']:.3g}",
                c["verdict"],
            ]
            for c in results["analysis"]["primary"]
        ]
        click.echo(
            _table(["primary contrast", "mean", "95% t-interval", "Holm p", "Holm p (equivalence)", "verdict"], rows)
        )
    click.echo(f"report: {report}")
    if not g["passed"]:  # a study whose gate failed answers nothing: say so in the exit status too
        raise errors.RedisyncError(
            f"the gate failed (single - uniform = {g['mean_difference']:+.3f}); report: {report}"
        )


def _num(x: float, digits: int) -> str:
    """``x`` to ``digits`` decimals, never as a negative zero."""
    return f"{round(x, digits) + 0.0:.{digits}f}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h"


def _connected(url: str | None, run: str = "default") -> Any:
    """A store that answered a PING: every connection problem ends here, naming the URL."""
    store = connect(url, run=run)
    store.ping()
    return store


def _store(url: str | None, run: str) -> Any:
    store = _connected(url, run)
    store.schema  # noqa: B018  (raises RunNotFound, naming the run, when there is none)
    return store


def _registered_store(url: str, run: str, interval: float) -> Any:
    """The run's store, once it is registered (saying once that it waits)."""
    waiting = False
    while True:
        try:
            return _store(url, run)
        except errors.RunNotFound:
            if not waiting:
                click.echo(f"waiting for run {run!r} at {masked_url(url)} to be registered (Ctrl-C to stop)")
                waiting = True
            time.sleep(interval)


def _snapshot_file(path: str) -> RunSnapshot:
    """The snapshot in ``path``, or a CorruptSnapshot that names the file and says what is wrong."""
    try:
        return RunSnapshot.model_validate_json(Path(path).read_bytes())
    except FileNotFoundError:
        raise errors.CorruptSnapshot(f"{path}: no such file") from None
    except OSError as e:
        raise errors.CorruptSnapshot(f"{path}: cannot read it ({e.strerror})") from None
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(map(str, err.get("loc", ())))
        if err["type"] == "json_invalid":
            problem = f"not JSON ({err['msg']})"
        elif err["type"] == "missing":
            problem = f"the field {where!r} is missing"
        else:
            problem = f"the field {where!r} is wrong: {err['msg']}"
        raise errors.CorruptSnapshot(f"{path} is not a redisync snapshot: {problem}") from None


@cli.command()
@SERVER_URL
@click.option("--run", default=None, help="only this run")
@click.option("--json", "as_json", is_flag=True, help="print as JSON")
def inspect(url: str | None, run: str | None, as_json: bool) -> None:
    """Runs, keys, specs, versions, slots, stream lengths and dead letters."""
    url = _not_embedded(url, "inspect")
    if run is not None:
        report = [describe_run(_store(url, run))]
    else:
        report, skipped = describe_runs(_connected(url).redis, lambda name: _store(url, name))
        for key, why in skipped:
            click.echo(f"skipped {key}: {why}", err=True)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    if not report:
        click.echo(f"no runs at {masked_url(url)}")
    for r in report:
        click.echo(
            f"run {r['run']}  epoch {r['epoch']}  fleet version {r['fleet_version']}  updated {_age(r['updated_age_s'])} ago  "
            f"reports {r['reports']}  dead letters {r['dead_letters']}"
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
                    _age(k["updated_age_s"]),
                ]
            )
        click.echo(_table(["key", "semantics", "shape", "spec", "version", "writers", "count", "updated"], rows))
        slots = [
            [
                k["key"],
                s["shard"],
                s["incarnation"],
                s["seq"],
                _age(s["age_s"]),
                f"{s['count']:g}",
                "stale: dropped at the next fold" if s["stale"] else "live",
            ]
            for k in r["keys"]
            for s in k.get("slots", [])
        ]
        if slots:
            click.echo("\n" + _table(["slot of key", "shard", "incarnation", "seq", "age", "count", "state"], slots))
        for d in r["newest_dead_letters"]:
            click.echo(
                f"dead letter {d['id']}: shard {d.get('shard')} {d.get('reason')} {d.get('key') or ''} - {d.get('detail')}"
            )
        click.echo("")


@cli.command()
@SERVER_URL
@click.option("--run", required=True, help="the run to watch")
@click.option(
    "--interval", default=1.0, show_default=True, type=click.FloatRange(0.05, 3600), help="seconds between refreshes"
)
@click.option("--count", default=0, type=click.IntRange(0), help="stop after this many refreshes (0: until Ctrl-C)")
def watch(url: str | None, run: str, interval: float, count: int) -> None:
    """A live view of one run: version rate, per-shard staleness and drift, rejected reports. Started
    before the run exists (watching a training about to start), it waits for it."""
    url = _not_embedded(url, "watch")
    last: tuple[float, int, int] | None = None
    shown = 0
    try:
        store = _registered_store(url, run, interval)
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
                row = [shard, _age(ages[shard])]
                for d in drifts.values():
                    s = d["shards"].get(shard)
                    if d["kind"] == "moments":
                        row += ["-" if s is None else _num(s["offset_sd"], 2)]
                    else:
                        row += ["-", "-"] if s is None else [_num(s["tv"], 4), _num(s["entropy"], 3)]
                rows.append(row)
            headers = ["shard", "last report"]
            for name, d in drifts.items():
                headers += (
                    [f"{name} |mean offset| (pooled sd)"] if d["kind"] == "moments" else [f"{name} TV", "entropy"]
                )
            lines.append(_table(headers, rows) if rows else "no shard has reported yet")
            for name, d in drifts.items():
                if d["kind"] == "distribution":
                    lines.append(f"pooled entropy of {name}: {_num(d['pooled_entropy'], 3)}")
            click.echo(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + "\n".join(lines), nl=True)
            shown += 1
            if count and shown >= count:
                return
            time.sleep(max(0.0, interval - (time.monotonic() - t)))
    except KeyboardInterrupt:
        click.echo("\nstopped")


@cli.command()
@SERVER_URL
@click.option("--run", required=True, help="the run to save")
@click.argument("path", type=click.Path(dir_okay=False))
def snapshot(url: str | None, run: str, path: str) -> None:
    """Save a run's whole state to PATH (JSON, format redisync.snapshot v1)."""
    snap = _store(_not_embedded(url, "snapshot"), run).snapshot()
    try:
        Path(path).write_text(snap.model_dump_json(indent=1))
    except OSError as e:
        raise errors.RedisyncError(f"{path}: cannot write the snapshot there ({e.strerror})") from None
    click.echo(f"saved run {run} (fleet version {_fleet_version(snap)}) to {path}")


@cli.command()
@SERVER_URL
@click.option("--run", required=True, help="the run to replace (may differ from the saved run's name)")
@click.argument("path", type=click.Path(dir_okay=False))
def restore(url: str | None, run: str, path: str) -> None:
    """Replace a run's state by the snapshot in PATH, under a new epoch."""
    url = _not_embedded(url, "restore")
    snap = _snapshot_file(path)
    store = _connected(url, run)
    try:
        epoch = store.restore(snap)
    except errors.CorruptSnapshot as e:
        raise errors.CorruptSnapshot(f"{path}: {e}") from None
    click.echo(f"restored run {run} from {path} (saved from run {snap.run}); new epoch {epoch}")


def _fleet_version(snap: RunSnapshot) -> int:
    return int(base64.b64decode(snap.hashes["meta"]["fleet_version"]))


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
