"""``redisync advise``: how far a fleet's unsynced samplers would sample from one unsharded run, measured
as an observing sampler measures it, on a simulated fleet of the user's configuration
(`redisync.terms.drift_model.measure`: the sampler's own formulas run step by step)."""

from __future__ import annotations

import json

import click

from ..terms.formulas import DRIFT_WARNING_TV, MIXES
from .common import num, table

MAX_BINS = 1000  # the simulation's work grows with the bins squared (`drift_model.WORK_BUDGET` bounds it)

LIMITS = (
    "What advise can claim: it runs the sampler's formulas step by step on a fleet of the configuration given, "
    "with the failure law given (failures per env per step, hard bins and how much harder, an episode's "
    "length) held still, and measures each shard's distance from the fleet's pooled distribution at the same "
    "moment, as a sampler in mode='observe' measures it in a run. It says how differently shards would sample, "
    "not what that does to training: whether a difference in start distributions slows learning depends on "
    "the task and the learner, which the simulation does not see, and a policy that is still learning moves "
    "the failure law. On the walker study's configuration (16 x 32 envs, alpha 0.01, 120 bins) it measures "
    "about 0.43 where the study's runs recorded 0.437. To know your own run's drift, measure it: mode='observe'."
)


@click.command(short_help="Predict how far unsynced samplers sample from one unsharded run.")
@click.option("--shards", required=True, type=click.IntRange(1, 100_000), help="collector shards (processes)")
@click.option("--envs-per-shard", required=True, type=click.IntRange(1, 10_000_000), help="envs in each shard")
@click.option("--alpha", default=0.001, show_default=True, type=click.FloatRange(1e-9, 1),
              help="the failure EMA's rate (BeyondMimic's 0.001; a window of at most 10^9 steps)")  # fmt: skip
@click.option("--bins", required=True, type=click.IntRange(2, MAX_BINS),
              help=f"the sampler's bins (one per second; at most {MAX_BINS}: the model's time grows with the cube of "
              "the bins, 120 take about half a minute)")  # fmt: skip
@click.option("--failure-rate", type=click.FloatRange(0, 1, min_open=True),
              help="failures per env per env step (the sampler's ema_failures_per_step metric divided by the envs "
              "per shard)")  # fmt: skip
@click.option("--ema-failures-per-step", type=click.FloatRange(0, min_open=True),
              help="instead of --failure-rate: the sampler's ema_failures_per_step metric, as a shard logs it "
              "(its failure EMA's mass: the shard's failures per env step)")  # fmt: skip
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
    failure_rate: float | None,
    ema_failures_per_step: float | None,
    episode_s: float,
    step_dt: float,
    hard_bins: int,
    hard_ratio: float,
    uniform_ratio: float,
    mix: str,
    as_json: bool,
) -> None:
    """Measure, on a simulated fleet, how differently SHARDS unsynced samplers of ENVS-PER-SHARD envs each
    sample start frames from the fleet's pooled distribution (what mode='pooled' samples from)."""
    from ..errors import ConfigurationError
    from ..terms.drift_model import FleetModel, measure, profile
    from ..terms.formulas import ema_statistics

    if (failure_rate is None) == (ema_failures_per_step is None):
        raise click.UsageError("give one of --failure-rate and --ema-failures-per-step")
    if failure_rate is None:
        assert ema_failures_per_step is not None
        failure_rate = ema_failures_per_step / envs_per_shard
    if step_dt > episode_s:
        raise click.BadParameter(
            f"an env step of {step_dt:g} s is longer than the episode ({episode_s:g} s)", param_hint="'--step-dt'"
        )
    episode_steps = max(1, round(episode_s / step_dt))
    start_rate = min(1.0, 1.0 / episode_steps + failure_rate)  # episodes end by a time-out or a failure
    episode_bins = max(1, round(episode_s))
    try:
        hazard, hard = profile(
            bins, failure_rate, start_rate=start_rate, episode_bins=episode_bins, hard_bins=hard_bins,
            hard_ratio=hard_ratio,
        )  # fmt: skip
        model = FleetModel(
            shards, envs_per_shard, hazard, alpha=alpha, start_rate=start_rate, uniform_ratio=uniform_ratio,
            mix=mix,  # type: ignore[arg-type]
            episode_bins=episode_bins, hard=hard,
        )  # fmt: skip
        m = measure(model) if shards > 1 else None
    except ConfigurationError as e:
        raise click.UsageError(str(e)) from None
    verdict = _verdict(shards, None if m is None else m["shard_distance"])
    if m is None:  # one shard: its own EMA is the fleet's
        click.echo(json.dumps({"shards": 1, "verdict": verdict}, indent=1) if as_json else verdict)
        return
    arms = {
        arm: {
            "shard_distance": m["shard_distance"] if arm == "local" else 0.0,
            "fleet_distance": m["fleet_distance"] if arm == "local" else 0.0,
            "disagreement": m["disagreement"] if arm == "local" else 0.0,
            "shard_noise": m["shard_noise" if arm == "local" else "pooled_noise"],
            "skill_share": m[f"{arm}_skill_share"] if hard_bins else None,
            "ema_mass": m[f"{arm}_ema_mass"],
            **{
                k: v
                for k, v in ema_statistics(m[f"{arm}_ema_mass"], bins, alpha, uniform_ratio, mix).items()
                if k in ("failures_per_bin_window", "uniform_share")
            },
        }
        for arm in ("local", "pooled")
    }
    if as_json:
        out = {
            "configuration": {"shards": shards, "envs_per_shard": envs_per_shard, "alpha": alpha, "bins": bins,
                              "failure_rate": failure_rate, "episode_s": episode_s, "step_dt": step_dt,
                              "hard_bins": hard_bins, "hard_ratio": hard_ratio, "uniform_ratio": uniform_ratio,
                              "mix": mix},
            "simulation": {k: m[k] for k in ("steps", "stride", "seed")},
            **arms,
            "arms_time_averaged_distance": m["distance_from_pooled"],
            "verdict": verdict,
            "limits": LIMITS,
        }  # fmt: skip
        click.echo(json.dumps(out, indent=1))
        return
    local, pooled = arms["local"], arms["pooled"]
    rows = [
        ["a shard's distance from the fleet's pooled distribution, now (TV)", num(local["shard_distance"], 3), "0.000"],
        ["the shards' mixture's distance from it (what the buffer receives)", num(local["fleet_distance"], 3),
         "0.000"],
        ["a shard's own noise (TV from its time average)", num(local["shard_noise"], 3), num(pooled["shard_noise"], 3)],
        ["share of starts in the hard bins", num(local["skill_share"], 3) if hard_bins else "-",
         num(pooled["skill_share"], 3) if hard_bins else "-"],
        ["failures per bin in the EMA's window", num(local["failures_per_bin_window"], 2),
         num(pooled["failures_per_bin_window"], 2)],
        ["uniform share of the start distribution", num(local["uniform_share"], 3), num(pooled["uniform_share"], 3)],
    ]  # fmt: skip
    click.echo(
        f"{shards} shards x {envs_per_shard} envs, alpha {alpha}, {bins} bins, {failure_rate:.3g} failures per env "
        f"per step, {mix} mix" + (f", {hard_bins} hard bins x{hard_ratio:g}" if hard_bins else "")
    )
    click.echo(
        f"Measured on a simulated fleet over {m['steps']} env steps ({round(m['steps'] * alpha)} EMA windows), as a "
        "sampler in mode='observe' measures it:"
    )
    click.echo(table(["figure", "unsynced (local)", "synced (pooled)"], rows))
    click.echo(verdict)
    click.echo(LIMITS)


def _verdict(shards: int, shard_distance: float | None) -> str:
    """What to do, in one line, with the evidence it rests on and its limit."""
    if shard_distance is None:
        return f"Verdict: nothing to sync with {shards} shard: its own failure EMA is the whole fleet's."
    if shard_distance >= DRIFT_WARNING_TV:
        return (
            f"Verdict: keep 'pooled'. Each unsynced shard would sample {shard_distance:.3f} (TV) from the fleet's "
            f"pooled distribution, at least the {DRIFT_WARNING_TV:.2f} at which a walker's unsynced shards learnt "
            "its skill segments worse (one task, 10 seeds)."
        )
    return (
        f"Verdict: 'local' would sample within {shard_distance:.3f} (TV) of the fleet's pooled distribution here, "
        f"below the {DRIFT_WARNING_TV:.2f} at which a walker's unsynced shards learnt worse (one task: no harm is "
        "shown below it either); measure your run with mode='observe' to confirm."
    )
