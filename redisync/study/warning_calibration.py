"""The drift warning calibrated against measured harm (the plan: ``docs/ab/warning-calibration-plan.md``).

Reads the second follow-up's run files — the only study that recorded every shard's failure-EMA
statistics at every drift record — and judges, for a rule (`WarningThresholds`), on which seeds
of each unsynced arm the sampler would have warned: at some record, for some shard, its own EMA poor
and the fleet's pooled EMA (N shards like it, as the sampler computes at run time) fair. The grid
search and its tie rule are the plan's; ``python -m redisync.study.warning_calibration`` writes the
committed ``records/ab/warning-calibration.json`` and ``.md``."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..terms.formulas import WarningThresholds, ema_statistics, ema_warning
from .fleet import ARMS

UNIFORM_RATIO = 0.1  # the studies' sampler default
HARM_SHOWN = ("local-16-shards", "local-8-shards", "local-paper-16-shards")
NO_HARM_SHOWN = "local"  # 4 shards of 256 envs: the negative control
SEEDS_FIRING_WHERE_HARM, SEEDS_FIRING_WHERE_NONE = 0.8, 0.2  # the plan's criterion
TODAY = WarningThresholds(0.5, 0.5, 0.5, 0.5)  # the rule before the calibration
GRID = {
    "noisy_relative_sd": (0.3, 0.4, 0.5, 0.6, 0.7),
    "fair_relative_sd": (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5),
    "flat_uniform_share": (0.3, 0.5, 0.7, 0.9, 1.01),
    "fair_uniform_share": (0.05, 0.1, 0.2, 0.5),
}


def _runs(runs_dir: Path, arm: str) -> list[dict[str, Any]]:
    named = re.compile(rf"H-{re.escape(arm)}-\d+\.json")  # (not H-local-16-shards-300.json for "local")
    return [json.loads(p.read_text()) for p in sorted(runs_dir.iterdir()) if named.fullmatch(p.name)]


def seed_fires(run: dict[str, Any], arm: str, rule: WarningThresholds) -> bool:
    """Whether a local sampler of this run would have warned: for some shard at some drift record, its
    own EMA poor and the pooled EMA of its fleet (its shard count, each like it) fair."""
    config, shards, mix = run["config"], run["run"]["shards"], ARMS[arm].mix
    bins, alpha = config["task"]["bins"], config["sampler_alpha"]
    for record in run["run"]["drift"]:
        for shard in record["ema"]:
            mass = shard["failures_per_bin_window"] * bins * alpha
            own = ema_statistics(mass, bins, alpha, UNIFORM_RATIO, mix)
            fleet = ema_statistics(shards * mass, bins, alpha, UNIFORM_RATIO, mix)
            if ema_warning(own, fleet, "shard", rule) is not None:
                return True
    return False


def firing(runs_dir: Path, rule: WarningThresholds) -> dict[str, list[bool]]:
    """Per arm (the harm-shown arms and the negative control), whether each seed fired."""
    return {arm: [seed_fires(r, arm, rule) for r in _runs(runs_dir, arm)] for arm in (*HARM_SHOWN, NO_HARM_SHOWN)}


def meets_criterion(fired: dict[str, list[bool]]) -> bool:
    """The plan's criterion: each harm-shown arm fires on ≥ 80 % of its seeds, the negative control on ≤ 20 %."""
    share = {arm: sum(f) / len(f) for arm, f in fired.items()}
    return all(share[a] >= SEEDS_FIRING_WHERE_HARM for a in HARM_SHOWN) and (
        share[NO_HARM_SHOWN] <= SEEDS_FIRING_WHERE_NONE
    )


def _steps_from_today(rule: WarningThresholds) -> int:
    return sum(abs(GRID[name].index(getattr(rule, name)) - GRID[name].index(0.5)) for name in GRID)


def calibrate(runs_dir: Path) -> dict[str, Any]:
    """Every grid point's firing, and the chosen one: the largest margin (the harm-shown arms' smallest
    firing share less the negative control's) among the points that meet the criterion; ties to the
    point nearest today's thresholds, then to the lower noise thresholds. None chosen when none meets it."""
    runs = {arm: _runs(runs_dir, arm) for arm in (*HARM_SHOWN, NO_HARM_SHOWN)}
    points: list[dict[str, Any]] = []
    for noisy, fair_sd, flat, fair_share in itertools.product(*GRID.values()):
        if fair_sd > noisy:
            continue
        rule = WarningThresholds(noisy, flat, fair_sd, fair_share)
        fired = {arm: [seed_fires(r, arm, rule) for r in rs] for arm, rs in runs.items()}
        share = {arm: sum(f) / len(f) for arm, f in fired.items()}
        points.append(
            {
                "rule": vars(rule),
                "seeds_fired": {arm: sum(f) for arm, f in fired.items()},
                "seeds": {arm: len(f) for arm, f in fired.items()},
                "meets_criterion": meets_criterion(fired),
                "margin": min(share[a] for a in HARM_SHOWN) - share[NO_HARM_SHOWN],
                "steps_from_today": _steps_from_today(rule),
            }
        )
    passing = [p for p in points if p["meets_criterion"]]
    chosen = min(
        passing,
        key=lambda p: (
            -p["margin"],
            p["steps_from_today"],
            p["rule"]["noisy_relative_sd"],
            p["rule"]["fair_relative_sd"],
        ),
        default=None,
    )
    today = {arm: sum(f) for arm, f in firing(runs_dir, TODAY).items()}
    return {
        "runs": str(runs_dir),
        "harm_shown": list(HARM_SHOWN),
        "negative_control": NO_HARM_SHOWN,
        "criterion": {
            "harm_shown_at_least": SEEDS_FIRING_WHERE_HARM,
            "negative_control_at_most": SEEDS_FIRING_WHERE_NONE,
        },
        "today": {"rule": vars(TODAY), "seeds_fired": today},
        "points": len(points),
        "passing": len(passing),
        "chosen": chosen,
    }


def report(result: dict[str, Any]) -> str:
    """The calibration's outcome as Markdown, every figure from ``result``."""
    chosen, today = result["chosen"], result["today"]
    arms = [*result["harm_shown"], result["negative_control"]]
    lines = [
        "# The drift warning, calibrated against measured harm",
        "",
        "Plan: `docs/ab/warning-calibration-plan.md`; data: the second follow-up's run files "
        f"(`{result['runs']}`); figures: `records/ab/warning-calibration.json` "
        "(`python -m redisync.study.warning_calibration`).",
        "",
        "Seeds on which a `local` sampler would have warned, out of 10 per arm:",
        "",
        "| rule | " + " | ".join(f"`{a}`" for a in arms) + " |",
        "|---|" + "---|" * len(arms),
        "| before (poor: noise ≥ 0.5 or uniform share ≥ 0.5; fair: both ≤ 0.5) | "
        + " | ".join(str(today["seeds_fired"][a]) for a in arms)
        + " |",
    ]
    if chosen is None:
        lines += ["", f"None of the {result['points']} grid points met the criterion."]
        return "\n".join(lines) + "\n"
    r = chosen["rule"]
    lines += [
        f"| calibrated (poor: noise ≥ {r['noisy_relative_sd']} or uniform share ≥ {r['flat_uniform_share']}; "
        f"fair: noise ≤ {r['fair_relative_sd']} and uniform share ≤ {r['fair_uniform_share']}) | "
        + " | ".join(str(chosen["seeds_fired"][a]) for a in arms)
        + " |",
        "",
        f"{result['passing']} of {result['points']} grid points met the criterion (each arm where harm was shown "
        f"fires on ≥ {result['criterion']['harm_shown_at_least']:.0%} of its seeds, the 256-env arm on ≤ "
        f"{result['criterion']['negative_control_at_most']:.0%}); the plan's tie rule chose the one above "
        f"(margin {chosen['margin']:.1f}).",
        "",
        "What this does and does not show: the rule was chosen on the very runs it is judged on (in-sample), on a "
        "toy task, and its negative control is an arm where no harm was *shown* (interval −0.084 to 0.043), not "
        "one where harm was ruled out. A warning is a risk to look at, not proof of harm.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Compute the calibration from the committed runs and write its JSON and its report."""
    root = Path(argv[0] if argv else ".")
    result = calibrate(root / "records" / "ab" / "second-follow-up" / "runs")
    result["runs"] = "records/ab/second-follow-up/runs"
    (root / "records" / "ab" / "warning-calibration.json").write_text(json.dumps(result, indent=1) + "\n")
    (root / "docs" / "ab" / "warning-calibration.md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main(sys.argv[1:])
