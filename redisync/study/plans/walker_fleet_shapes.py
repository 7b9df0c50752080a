"""The fifth study: when does drift hurt on physics? (The plan: ``docs/ab/fifth-study-plan.md``.)

The fourth study showed harm once, at one configuration (16 shards × 32 envs, α 0.01: local − pooled
−0.241 in skill success AUC, its paired sd 0.287, so its minimum detectable effect was 0.247 - about the
effect found). This plan, on the same walker and budget (512 envs, 2 048 000 env steps):

- **replication** (`REPLICATION`): 16 × 32 at α 0.01 on fresh seeds, pooled with the fourth's ten pairs
  for the primary contrast (one-sided paired t-test of "local lower", level `ALPHA`);
- **lower drift** (`LOW`): 4 × 128 at α 0.001, where the sampler's step-by-step simulation predicts the
  lowest shard drift of the configurations tried (its EMA averages ten times more failures; the
  curriculum also concentrates less: the plan reports both);
- **more shards** (`MANY`): 64 × 8 at α 0.01.

Harm is read against the drift each configuration's local runs *measured* (their records: the TV
distance of each shard's distribution from the pooled one at the same moment). The measured-drift
warning (`redisync.terms.formulas.drift_warning`, threshold frozen before these runs) is judged out
of sample: per configuration, whether it fired on the local runs' records, against whether harm was
shown there. Pairs run seed by seed, configurations interleaved, so that every configuration has pairs
early; every run is kept as it finishes and the same command resumes.

``python -m redisync.study.plans.walker_fleet_shapes --out DIR --workers N`` runs (or resumes) it;
``--report-only`` trains nothing and writes the summary from the runs kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...terms.formulas import DRIFT_WARNING_TV
from ..fleet import StudyConfig
from ..runner import Stage, run_stages
from . import walker_contrast

ROOT = Path(__file__).resolve().parents[3]
FOURTH_CONTRAST = ROOT / "records" / "ab" / "fourth-study" / "contrast"
PAIRED_SD = 0.287  # the fourth study's contrast: the sd of its ten paired differences
ALPHA, POWER = 0.05, 0.8
ARMS = ("local", "pooled")
PRIMARY_METRIC = walker_contrast.PRIMARY_METRIC


@dataclass(frozen=True)
class Configuration:
    """One fleet shape of the plan, its EMA rate, its seeds and the folder its runs are kept in."""

    name: str
    shards: int
    envs_per_shard: int
    alpha: float
    seeds: tuple[int, ...]

    def config(self) -> StudyConfig:
        return replace(
            walker_contrast.CONFIG, shards=self.shards, envs_per_shard=self.envs_per_shard, sampler_alpha=self.alpha
        )


REPLICATION = Configuration("16x32", 16, 32, 0.01, tuple(range(640, 650)))
LOW = Configuration("4x128-alpha0.001", 4, 128, 0.001, tuple(range(650, 656)))
MANY = Configuration("64x8", 64, 8, 0.01, tuple(range(660, 666)))
CONFIGURATIONS = (REPLICATION, LOW, MANY)


def minimum_detectable_effect(pairs: int, sd: float = PAIRED_SD) -> float:
    """The smallest mean paired difference a one-sided paired t-test at `ALPHA` detects with `POWER`
    (the normal approximation with t quantiles): ``(t(1−α) + t(power)) · sd / √n``."""
    from scipy import stats

    df = pairs - 1
    return float((stats.t.ppf(1 - ALPHA, df) + stats.t.ppf(POWER, df)) * sd / np.sqrt(pairs))


def _tagger(name: str) -> Callable[[dict[str, Any]], None]:
    """Marks a run with its configuration's name (for the summary)."""

    def tag(run: dict[str, Any]) -> None:
        run["configuration"] = name

    return tag


def stages() -> list[Stage]:
    """Seed by seed, the configurations interleaved: pair i of each configuration in turn."""
    out = []
    for i in range(max(len(c.seeds) for c in CONFIGURATIONS)):
        for c in CONFIGURATIONS:
            if i < len(c.seeds):
                seed = c.seeds[i]
                out.append(
                    Stage(
                        f"{c.name}: local and pooled, seed {seed}",
                        [("H", arm, [seed]) for arm in ARMS],
                        f"{c.name} seed {seed}",
                        config=c.config(),
                        folder=c.name,
                        tag=_tagger(c.name),
                    )
                )
    return out


def measured_drift(runs: list[dict[str, Any]]) -> float | None:
    """The mean recorded drift of the runs' shards (their distributions against the pooled one)."""
    values = [np.mean(r["tv"]) for run in runs for r in run["drift"] if r["tv"]]
    return float(np.mean(values)) if values else None


def _contrast(local: dict[int, float], pooled: dict[int, float]) -> dict[str, Any]:
    from scipy import stats

    seeds = sorted(set(local) & set(pooled))
    d = np.asarray([local[s] - pooled[s] for s in seeds])
    out: dict[str, Any] = {"pairs": len(seeds), "differences": dict(zip(seeds, d.tolist(), strict=True))}
    if len(seeds) >= 2:
        half = float(stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d)))
        out |= {
            "mean": float(d.mean()),
            "ci95": [float(d.mean()) - half, float(d.mean()) + half],
            "sd": float(d.std(ddof=1)),
            "p_one_sided_t": float(stats.ttest_1samp(d, 0.0, alternative="less").pvalue),
            "achieved_mde": minimum_detectable_effect(len(seeds), float(d.std(ddof=1))),
        }
    return out


def _fourth_pairs() -> tuple[dict[int, float], dict[int, float]]:
    local: dict[int, float] = {}
    pooled: dict[int, float] = {}
    for path in sorted(FOURTH_CONTRAST.glob("H-*.json")):
        run = json.loads(path.read_text())["run"]
        (local if run["arm"] == "local" else pooled)[run["seed"]] = run["summary"][PRIMARY_METRIC]
    return local, pooled


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: the contrast local − pooled, the drift its local runs measured, and whether
    the warning fired on them; the primary contrast (the replication pooled with the fourth's pairs)."""
    from ..drift_calibration import peak_running_mean

    out: dict[str, Any] = {"threshold": DRIFT_WARNING_TV, "configurations": {}}
    for c in CONFIGURATIONS:
        mine = [r for r in runs if r.get("configuration") == c.name]
        table = {arm: {r["seed"]: r["summary"][PRIMARY_METRIC] for r in mine if r["arm"] == arm} for arm in ARMS}
        local_runs = [r for r in mine if r["arm"] == "local"]
        fires = [peak_running_mean({"run": r}) >= DRIFT_WARNING_TV for r in local_runs]
        out["configurations"][c.name] = {
            "planned_pairs": len(c.seeds),
            "contrast": _contrast(table["local"], table["pooled"]),
            "measured_local_drift": measured_drift(local_runs),
            "measured_pooled_drift": measured_drift([r for r in mine if r["arm"] == "pooled"]),
            "warning_fired_on_local_runs": f"{sum(fires)} of {len(fires)}",
        }
    local4, pooled4 = _fourth_pairs()
    mine = [r for r in runs if r.get("configuration") == REPLICATION.name]
    local5 = {r["seed"]: r["summary"][PRIMARY_METRIC] for r in mine if r["arm"] == "local"}
    pooled5 = {r["seed"]: r["summary"][PRIMARY_METRIC] for r in mine if r["arm"] == "pooled"}
    out["primary"] = {
        "what": "local - pooled in skill success AUC at 16 x 32, the fourth study's ten pairs and this study's",
        "planned_pairs": len(local4) + len(REPLICATION.seeds),
        "planned_mde": minimum_detectable_effect(len(local4) + len(REPLICATION.seeds)),
        **_contrast(local4 | local5, pooled4 | pooled5),
    }
    return out


FAILURE_LAW = {
    "failure_rate": 0.0007,
    "episode_s": 10.0,
    "step_dt": 0.02,
    "bins": 120,
    "hard_bins": 2,
    "hard_ratio": 10.0,
}
"""The failure law the fourth study's prediction used (records/ab/fourth-study/model-prediction.json)."""


def predictions(steps: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Before the runs: each configuration's shard distance from pooled as ``redisync advise``'s model
    predicts it and as the sampler's step-by-step simulation gives it (`drift_model.simulate`)."""
    from ...terms.drift_model import FleetModel, predict, profile, simulate

    law = FAILURE_LAW
    start_rate = min(1.0, law["step_dt"] / law["episode_s"] + law["failure_rate"])
    episode_bins = round(law["episode_s"])
    hazard, hard = profile(
        int(law["bins"]), law["failure_rate"], start_rate=start_rate, episode_bins=episode_bins,
        hard_bins=int(law["hard_bins"]), hard_ratio=law["hard_ratio"],
    )  # fmt: skip
    out: dict[str, Any] = {"failure_law": law, "simulation_steps": steps, "configurations": {}}
    for c in CONFIGURATIONS:
        model = FleetModel(
            c.shards,
            c.envs_per_shard,
            hazard,
            alpha=c.alpha,
            start_rate=start_rate,
            episode_bins=episode_bins,
            hard=hard,
        )
        out["configurations"][c.name] = {
            "advise_shard_distance": predict(model).local.shard_distance,
            "simulated_shard_distance": simulate(model, steps, seed)["pooled_arm_distance"],
            "planned_pairs": len(c.seeds),
            "mde_at_the_fourth_sd": minimum_detectable_effect(len(c.seeds)),
        }
    return out


def run(out: Path, *, workers: int, report_only: bool = False) -> dict[str, Any]:
    """The plan's stages (or, ``report_only``, the runs kept), the summary in ``out/summary.json``."""
    return run_stages(
        walker_contrast.CONFIG, walker_contrast.ENV, stages(), summarize, saved=out, summary_path=out / "summary.json",
        workers=workers, show_progress=False, on_stage=lambda label: print(label, flush=True), load_only=report_only,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m redisync.study.plans.walker_fleet_shapes", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="where the runs are kept (resumed from)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="train nothing: summarise the runs kept")
    parser.add_argument("--predict", action="store_true", help="train nothing: print the plan's predictions as JSON")
    args = parser.parse_args()
    if args.predict:
        print(json.dumps(predictions(), indent=1))
        return 0
    if not args.report_only:
        from ..provenance import require_clean

        require_clean("the fifth study")
    summary = run(args.out, workers=args.workers, report_only=args.report_only)
    print(json.dumps(summary["primary"], indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
