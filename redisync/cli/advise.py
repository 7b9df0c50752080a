"""``redisync advise``: how differently a fleet's unsynced samplers would sample from one unsharded run,
from the model of the sampler (`redisync.terms.drift_model`), for the user's own configuration."""

from __future__ import annotations

import json

import click

from ..terms.formulas import MIXES
from .common import num, table

MAX_BINS = 200  # the model's cost grows about as the cube of the bins: 120 take about half a minute on a 2-core machine

LIMITS = (
    "What the model can claim: it computes the sampler's start distributions at their steady state for the "
    "failure law given (failures per env per step, hard bins and how much harder, an episode's length), "
    "with the linear-noise approximation of the EMA's noise. It says how differently shards would sample, "
    "not what that does to training: whether a difference in start distributions slows learning depends on "
    "the task and the learner, which the model does not see. A policy that is still learning moves the "
    "failure law faster than the steady state assumes. Checked against the sampler's formulas run step by "
    "step on the same failure law (the documentation's drift-model page). It under-read the one drift measured "
    "on physics: a walker's shard 0.186 from pooled where the runs recorded 0.437 (16 x 32 envs, alpha 0.01, 120 "
    "bins): to know your run's drift, measure it with the sampler's mode='observe'."
)


@click.command(short_help="Predict how far unsynced samplers sample from one unsharded run.")
@click.option("--shards", required=True, type=click.IntRange(1, 100_000), help="collector shards (processes)")
@click.option("--envs-per-shard", required=True, type=click.IntRange(1, 10_000_000), help="envs in each shard")
@click.option("--alpha", default=0.001, show_default=True, type=click.FloatRange(1e-9, 1),
              help="the failure EMA's rate (BeyondMimic's 0.001; a window of at most 10^9 steps)")  # fmt: skip
@click.option("--bins", required=True, type=click.IntRange(2, MAX_BINS),
              help=f"the sampler's bins (one per second; at most {MAX_BINS}: the model's time grows with the cube of "
              "the bins, 120 take about half a minute)")  # fmt: skip
@click.option("--failure-rate", required=True, type=click.FloatRange(0, 1, min_open=True),
              help="failures per env per env step, as your run logs them (the EMA's mass divided by the envs)")  # fmt: skip
@click.option("--episode-s", default=10.0, show_default=True, type=click.FloatRange(0, 86_400, min_open=True),
              help="an episode's length without a failure, in seconds (at most a day)")  # fmt: skip
@click.option("--step-dt", default=0.02, show_default=True, type=click.FloatRange(0, 60, min_open=True),
              help="the env step, in seconds (at most a minute, and at most the episode)")  # fmt: skip
@click.option("--hard-bins", default=0, show_default=True, type=click.IntRange(0),
              help="bins where failures concentrate (0: every bin alike)")  # fmt: skip
@click.option("--hard-ratio", default=10.0, show_default=True, type=click.FloatRange(1),
              help="how many times as likely to fail a hard bin is")  # fmt: skip
@click.option("--uniform-ratio", default=0.1, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="the sampler's uniform ratio ε")  # fmt: skip
@click.option("--mix", default="code", show_default=True, type=click.Choice(MIXES),
              help="the uniform mix: BeyondMimic's code or its paper")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="print the model's figures as JSON")
def advise(
    shards: int,
    envs_per_shard: int,
    alpha: float,
    bins: int,
    failure_rate: float,
    episode_s: float,
    step_dt: float,
    hard_bins: int,
    hard_ratio: float,
    uniform_ratio: float,
    mix: str,
    as_json: bool,
) -> None:
    """Predict, from a model of the adaptive sampler, how differently SHARDS unsynced samplers of
    ENVS-PER-SHARD envs each sample start frames from one unsharded run of all the envs (the pooled sampler)."""
    from dataclasses import replace

    from ..terms.drift_model import WARNING_DISTANCE, FleetModel, predict, profile

    if step_dt > episode_s:
        raise click.BadParameter(
            f"an env step of {step_dt:g} s is longer than the episode ({episode_s:g} s)", param_hint="'--step-dt'"
        )

    episode_steps = max(1, round(episode_s / step_dt))
    start_rate = min(1.0, 1.0 / episode_steps + failure_rate)  # episodes end by a time-out or a failure
    episode_bins = max(1, round(episode_s))
    hazard, hard = profile(
        bins, failure_rate, start_rate=start_rate, episode_bins=episode_bins, hard_bins=hard_bins,
        hard_ratio=hard_ratio,
    )  # fmt: skip
    model = FleetModel(
        shards, envs_per_shard, hazard, alpha=alpha, start_rate=start_rate, uniform_ratio=uniform_ratio,
        mix=mix,  # type: ignore[arg-type]
        episode_bins=episode_bins, hard=hard,
    )  # fmt: skip
    p = predict(model)
    # the validated warning: the model told only what a shard measures (its failure rate, every bin
    # alike), firing at WARNING_DISTANCE (docs/ab/warning-validation.md)
    blind = p if not hard_bins else predict(replace(model, hazard=profile(
        bins, failure_rate, start_rate=start_rate, episode_bins=episode_bins)[0], hard=None))  # fmt: skip
    warns = blind.local.shard_distance >= WARNING_DISTANCE
    if as_json:
        out = p.to_dict()
        out["warning"] = {"fires": warns, "predicted_shard_distance": blind.local.shard_distance,
                          "threshold": WARNING_DISTANCE}  # fmt: skip
        for arm in ("local", "pooled"):
            out[arm].pop("distribution")
        out.pop("oracle")
        out["model"].pop("hazard")
        out["model"].pop("hard")
        out["limits"] = LIMITS
        click.echo(json.dumps(out, indent=1))
        return
    local, pooled = p.local, p.pooled
    rows = [
        ["failures per bin in the EMA's window", num(local.failures_per_bin_window, 2),
         num(pooled.failures_per_bin_window, 2)],
        ["uniform share of the start distribution", num(local.uniform_share, 3), num(pooled.uniform_share, 3)],
        ["a shard's distance from the pooled distribution (TV)", num(local.shard_distance, 3), "0.000"],
        ["disagreement between shards (TV from the fleet's mix)", num(local.disagreement, 3), "0.000"],
        ["share of starts in the hard bins", num(local.skill_share, 3) if hard_bins else "-",
         num(pooled.skill_share, 3) if hard_bins else "-"],
        ["distance from the noise-free pooled sampler (TV)", num(local.regret, 3), num(pooled.regret, 3)],
        ["  of which flattening (the uniform part weighs more)", num(local.parts["flattening"], 3),
         num(pooled.parts["flattening"], 3)],
        ["  of which noise (few failures per bin)", num(local.parts["noise"], 3), num(pooled.parts["noise"], 3)],
        ["  of which feedback (over-sampled bins fail more)", num(local.parts["feedback"], 3),
         num(pooled.parts["feedback"], 3)],
    ]  # fmt: skip
    click.echo(
        f"{shards} shards x {envs_per_shard} envs, alpha {alpha}, {bins} bins, {failure_rate} failures per env "
        f"per step, {mix} mix" + (f", {hard_bins} hard bins x{hard_ratio:g}" if hard_bins else "")
    )
    click.echo(table(["the model's figure", "unsynced (local)", "synced (pooled)"], rows))
    click.echo(
        f"The fleet's start distribution unsynced is {num(p.distance_from_pooled, 3)} (TV) from one unsharded "
        f"run's; each shard's own is {num(local.shard_distance, 3)} from it."
    )
    click.echo(
        f"The model's drift warning (judged against this model, not against runs: the documentation's "
        f"warning-validation report) "
        f"{'fires' if warns else 'stays quiet'}: from the failure rate alone it predicts a shard "
        f"{num(blind.local.shard_distance, 3)} from pooled, against its threshold {num(WARNING_DISTANCE, 3)}."
    )
    click.echo(_verdict(local.shard_distance))
    click.echo(LIMITS)


def _verdict(shard_distance: float) -> str:
    """What to do, in one line, with the evidence it rests on and its limit."""
    from ..terms.formulas import DRIFT_WARNING_TV

    if shard_distance >= DRIFT_WARNING_TV:
        return (
            f"Verdict: keep 'pooled'. Each unsynced shard would sample {shard_distance:.3f} from one run, at least the "
            f"{DRIFT_WARNING_TV:.2f} at which a walker's unsynced shards learnt its skill segments worse (one task)."
        )
    return (
        f"Verdict: 'local' would sample within {shard_distance:.3f} of one run here, below the {DRIFT_WARNING_TV:.2f} "
        "at which a walker's unsynced shards learnt worse; but the model under-reads drift at low failure counts "
        "(0.186 against a measured 0.437 on that walker): measure it with mode='observe' before relying on it."
    )
