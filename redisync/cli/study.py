"""``redisync ab``: the pre-registered study of when drift between shards hurts training."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from .. import errors
from ..store.client import masked_url
from .common import URL, needs, table


@click.command(short_help="Run the drift study (its gate, arms, report).")
@URL
@click.option(
    "--out",
    "out_dir",
    default="out/ab",
    show_default=True,
    type=click.Path(file_okay=False),
    help="folder for results.json and the run records (the committed study: --out records/ab)",
)
@click.option(
    "--pages",
    "pages_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="folder for report.md and the plots (default: OUT; the committed study: --pages docs/ab)",
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
@click.option(
    "--smoke",
    is_flag=True,
    help="the small CI configuration (minutes, not an hour): it checks the pipeline; its gate decision means nothing",
)
@click.option("--gate-only", is_flag=True, help="run the gate (single vs uniform on H) and stop")
@click.option(
    "--follow-up",
    is_flag=True,
    help="after the gate, the pre-registered follow-up (P1-P4, docs/ab/follow-up-plan.md) instead of the study",
)
@click.option(
    "--second-follow-up",
    is_flag=True,
    help="after the gate, the second pre-registered follow-up (A-C, docs/ab/second-follow-up-plan.md); every run is "
    "kept in OUT/runs as it finishes, and the same command again resumes where it stopped",
)
@click.option(
    "--third-study",
    is_flag=True,
    help="the third pre-registered study (docs/ab/third-study-plan.md) on the MuJoCo walker: its gate, then local "
    "vs pooled at two EMA rates; every run kept in OUT/runs as it finishes, the same command again resumes",
)
@click.option(
    "--fourth-study-pilots",
    is_flag=True,
    help="the fourth study's pilots on the learnable walker (learnability, then the paired sd); every run kept in "
    "OUT/pilot-N as it finishes (N: the pilot's round), the same command again resumes",
)
@click.option(
    "--fourth-study-gate",
    is_flag=True,
    help="the fourth study's gate (single against uniform on its fresh seeds, docs/ab/fourth-study-plan.md); every "
    "run kept in OUT/gate as it finishes, the same command again resumes",
)
@click.option(
    "--fourth-study-contrast",
    is_flag=True,
    help="the fourth study's primary contrast (local against pooled on its ten seeds), refused unless the gate's "
    "run files in OUT/gate passed; every run kept in OUT/contrast as it finishes, the same command again resumes",
)
@click.option(
    "--env-steps", default=None, type=click.IntRange(1_000), help="env steps per run (default: the configuration's)"
)
@click.option(
    "--env",
    "env_spec",
    default=None,
    help="'module:function' making your own TrackingEnv batches (the study page's 'Bring your own env')",
)
@click.option("--report-only", is_flag=True, help="rebuild the plots and report.md from OUT/results.json")
@click.option(
    "--allow-dirty",
    is_flag=True,
    help="run a study that keeps its runs (the second follow-up, the third study) from a checkout with "
    "uncommitted changes; each run file then records the diff's SHA-256 beside its commit",
)
@click.option("--no-progress", is_flag=True, help="no progress bar")
def ab(
    url: str | None,
    out_dir: str,
    pages_dir: str | None,
    seeds: int,
    secondary_seeds: int,
    workers: int,
    smoke: bool,
    gate_only: bool,
    follow_up: bool,
    second_follow_up: bool,
    third_study: bool,
    fourth_study_pilots: bool,
    fourth_study_gate: bool,
    fourth_study_contrast: bool,
    env_steps: int | None,
    env_spec: str | None,
    report_only: bool,
    allow_dirty: bool,
    no_progress: bool,
) -> None:
    """The drift study: the gate, then every sync arm on H and X trained with SAC; records in OUT, figures and report in PAGES."""
    needs("study")
    from ..study.fleet import StudyConfig
    from ..study.report import write_report
    from ..study.study import load_env_factory, run_study

    out = Path(out_dir)
    pages = Path(pages_dir) if pages_dir else None
    kept = third_study or second_follow_up or fourth_study_pilots or fourth_study_gate or fourth_study_contrast
    if kept and not report_only and not allow_dirty:
        from ..study.provenance import require_clean

        require_clean("redisync ab")  # its run files are the record: each must name the code that made it
    command = "redisync " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["ab"] else "redisync ab"
    if fourth_study_contrast:
        from ..study.fourth_study import run_contrast

        try:
            result = run_contrast(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        except errors.ConfigurationError as e:
            raise click.UsageError(str(e)) from None
        click.echo(json.dumps(result, indent=1, default=float))
        return
    if fourth_study_gate:
        from ..study.fourth_study import run_gate

        gate = run_gate(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        click.echo(json.dumps(gate, indent=1, default=float))
        return
    if fourth_study_pilots:
        from ..study.fourth_study import run_pilots

        summary = run_pilots(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        click.echo(json.dumps(summary, indent=1, default=float))
        return
    if third_study:  # its configuration and task are the plan's: fixed in redisync/study/third_study.py
        from ..study.third_study import run_third_study

        third = run_third_study(
            out, workers=workers, show_progress=not no_progress, report_only=report_only, on_stage=click.echo
        )
        click.echo(f"{third['runs_done']} of {third['runs_planned']} runs done; report: {out / 'report.md'}")
        return
    if report_only and second_follow_up:  # from the runs saved so far: the study may still be going
        from ..study.study import saved_results

        if not (out / "runs").is_dir():
            raise click.BadParameter(f"{out / 'runs'}: no saved runs of the second follow-up", param_hint="--out")
        results = saved_results(out / "runs", StudyConfig(), command.replace(" --report-only", ""))
        click.echo(f"{len(results['runs'])} of {results['planned_runs']} runs done")
        click.echo(f"report: {write_report(results, out, results['command'], pages)}")
        return
    if report_only:
        try:
            results = json.loads((out / "results.json").read_text())
        except (OSError, ValueError) as e:
            raise click.BadParameter(f"{out / 'results.json'}: {e}", param_hint="--out") from None
        click.echo(f"report: {write_report(results, out, results.get('command', command), pages)}")
        return
    if follow_up and second_follow_up:
        raise click.UsageError("--follow-up and --second-follow-up are two studies: run one at a time")
    cfg = StudyConfig().smoke() if smoke else StudyConfig()
    if env_steps is not None:
        cfg = replace(cfg, env_steps=env_steps)
    try:
        load_env_factory(env_spec, cfg)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--env") from None
    click.echo(
        f"{cfg.env_steps:,} env steps per run, {workers} workers; store: {masked_url(url) if url else 'embedded (one per worker)'}"
    )
    if smoke:
        click.echo(
            "--smoke checks the pipeline at CI's size: its gate decision means nothing at this size, and "
            "it may fail ('the gate failed', status 1)"
        )
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
        second_follow_up=second_follow_up,
        saved=out / "runs" if second_follow_up else None,
        on_stage=click.echo,
    )
    results["command"] = command
    report = write_report(results, out, command, pages)
    g = results["gate"]
    click.echo(
        f"gate: single - uniform = {g['mean_difference']:+.3f} (needs >= {g['threshold']}): "
        f"{'passed' if g['passed'] else 'FAILED'}"
    )
    for h in results.get("follow_up") or []:
        verdict = ("rejected: " if h["rejected"] else "not rejected: ") if h["tested"] else "not tested (descriptive): "
        click.echo(f"{h['name']} {h['contrast']}: {h['mean']:+.3f}, one-sided p {h['p_one_sided']:.3g}; {verdict}"
                   f"{h['decision']}")  # fmt: skip
    for c in results.get("second_follow_up") or []:
        test = f", one-sided p {c['p_one_sided']:.3g}" if "p_one_sided" in c else ""
        verdict = f"; {c['verdict']}" if "verdict" in c else ""
        click.echo(f"{c['question']} {c['contrast']}: {c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] over "
                   f"{len(c['seeds'])} seeds{test}{verdict}")  # fmt: skip
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
            table(["primary contrast", "mean", "95% t-interval", "Holm p", "Holm p (equivalence)", "verdict"], rows)
        )
    click.echo(f"report: {report}")
    if not g["passed"]:  # a study whose gate failed answers nothing: say so in the exit status too
        raise errors.RedisyncError(
            f"the gate failed (single - uniform = {g['mean_difference']:+.3f}); report: {report}"
        )
