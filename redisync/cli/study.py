"""``redisync ab``: the pre-registered study of when drift between shards hurts training."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import click

from .. import errors
from ..store.client import masked_url
from ..study.plans import BY_ID, PLANS
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
@click.option(
    "--plan",
    "plan_id",
    default="toy-study",
    show_default=True,
    type=click.Choice([p.id for p in PLANS]),
    help="the pre-registered plan to run (redisync.study.plans: PLANS says what each asks and what it was registered "
    "as); a plan that keeps its runs keeps each in OUT as it finishes, and the same command again resumes",
)
@click.option(
    "--stage",
    default=None,
    help="the plan's stage (toy-study: all, or gate alone; walker-contrast: pilots, gate or contrast, the contrast "
    "refused unless the gate's run files in OUT/gate passed); default: the plan's first",
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
    plan_id: str,
    stage: str | None,
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

    plan = BY_ID[plan_id]
    stage = stage or plan.stages[0]
    if stage not in plan.stages:
        raise click.BadParameter(
            f"{plan.id} has the stages {', '.join(plan.stages)}, not {stage!r}", param_hint="--stage"
        )
    gate_only = plan.id == "toy-study" and stage == "gate"
    follow_up, second_follow_up = plan.id == "toy-dose-mechanism", plan.id == "toy-mechanism-semantics"
    third_study, fleet_shapes = plan.id == "walker-ema-window", plan.id == "walker-fleet-shapes"
    contrast = plan.id == "walker-contrast"
    fourth_study_pilots, fourth_study_gate = contrast and stage == "pilots", contrast and stage == "gate"
    fourth_study_contrast = contrast and stage == "contrast"
    out = Path(out_dir)
    pages = Path(pages_dir) if pages_dir else None
    kept = third_study or second_follow_up or contrast or fleet_shapes
    if kept and not report_only and not allow_dirty:
        from ..study.provenance import require_clean

        require_clean("redisync ab")  # its run files are the record: each must name the code that made it
    command = "redisync " + " ".join(sys.argv[1:]) if sys.argv[1:2] == ["ab"] else "redisync ab"
    if fleet_shapes:
        from ..study.plans.walker_fleet_shapes import run as run_fleet_shapes

        summary = run_fleet_shapes(out, workers=workers, report_only=report_only)
        click.echo(json.dumps(summary["primary"], indent=1, default=float))
        return
    if fourth_study_contrast:
        from ..study.plans.walker_contrast import run_contrast

        try:
            result = run_contrast(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        except errors.ConfigurationError as e:
            raise click.UsageError(str(e)) from None
        click.echo(json.dumps(result, indent=1, default=float))
        return
    if fourth_study_gate:
        from ..study.plans.walker_contrast import run_gate

        gate = run_gate(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        click.echo(json.dumps(gate, indent=1, default=float))
        return
    if fourth_study_pilots:
        from ..study.plans.walker_contrast import run_pilots

        summary = run_pilots(out, workers=workers, show_progress=not no_progress, on_stage=click.echo)
        click.echo(json.dumps(summary, indent=1, default=float))
        return
    if third_study:  # its configuration and task are the plan's: fixed in redisync/study/plans/walker_ema_window.py
        from ..study.plans.walker_ema_window import run_third_study

        third = run_third_study(
            out, workers=workers, show_progress=not no_progress, report_only=report_only, on_stage=click.echo
        )
        click.echo(f"{third['runs_done']} of {third['runs_planned']} runs done; report: {out / 'report.md'}")
        return
    if report_only and second_follow_up:  # from the runs saved so far: the study may still be going
        from ..study.plans.toy_mechanism_semantics import saved_results

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
    after_gate = None
    if follow_up:
        from ..study.plans import toy_dose_mechanism

        after_gate = toy_dose_mechanism.after_gate()
    elif second_follow_up:
        from ..study.plans import toy_mechanism_semantics

        after_gate = toy_mechanism_semantics.after_gate()
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
        after_gate=after_gate,
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
