"""The sampler's warning rule (redisync.terms.formulas.EmaWatch) against the study's arms: trains one
seed of an arm of the drift study (the committed study's configuration) and prints, at each drift
record, each shard's own failure-EMA statistics and whether the rule would warn.

    python scripts/ema_statistics_arms.py local-16-shards single --seed 700 > records/ab/ema-statistics-DATE.txt

The rule must fire on the 64-env code-mix arm (local-16-shards: 16 shards of 64 envs, each sampling
from its own EMA) and stay quiet on the single-collector arm (single: one collector of 1 024 envs,
whose own EMA is its fleet's)."""

import argparse
import json
import statistics
import sys
from dataclasses import replace

from redisync.study.fleet import StudyConfig, run_arm
from redisync.study.study import condition_config, seeded
from redisync.terms.formulas import ema_warning


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("arms", nargs="+")
    parser.add_argument("--seed", type=int, default=700)
    parser.add_argument("--condition", default="H")
    parser.add_argument("--env-steps", type=int, default=None, help="fewer env steps per run (a quick look)")
    a = parser.parse_args()
    cfg = seeded(condition_config(StudyConfig(), a.condition), a.seed)
    if a.env_steps is not None:
        cfg = replace(cfg, env_steps=a.env_steps, drift_every=max(a.env_steps // 8, 1))
    print(
        f"# {' '.join(sys.argv)}: condition {a.condition}, seed {a.seed}, {cfg.env_steps:,} env steps per run, "
        f"sampler alpha {cfg.sampler_alpha}, {cfg.task.bins} bins"
    )
    for arm in a.arms:
        run = run_arm(cfg, arm, a.seed)
        print(
            f"\n## {arm}: {run['shards']} shard(s); completion AUC {statistics.mean(r['completion'] for r in run['curve']):.3f}"
        )
        print(
            "env_steps  shards warning  median n  min n  max noise  max uniform share  fleet n  fleet noise  fleet share"
        )
        fired = 0
        for row in run["drift"]:
            stats, fleet = row["ema"], row["ema_fleet"]
            warns = sum(ema_warning(s, fleet, "shard") is not None for s in stats)
            fired += warns
            n = sorted(s["failures_per_bin_window"] for s in stats)
            print(
                f"{row['env_steps']:>9}  {warns:>2}/{len(stats):<4}      {statistics.median(n):8.2f}  {n[0]:5.2f}  "
                f"{max(s['ema_relative_noise'] for s in stats):9.2f}  {max(s['uniform_share'] for s in stats):17.3f}  "
                f"{fleet['failures_per_bin_window']:7.2f}  {fleet['ema_relative_noise']:11.2f}  {fleet['uniform_share']:11.3f}"
            )
        print(
            json.dumps(
                {
                    "arm": arm,
                    "records": len(run["drift"]),
                    "shard_records_warning": fired,
                    "shard_records": sum(len(r["ema"]) for r in run["drift"]),
                    # every shard's statistics at every record, so that a test can judge them by today's rule
                    "ema": [
                        {"env_steps": r["env_steps"], "shards": r["ema"], "fleet": r["ema_fleet"]} for r in run["drift"]
                    ],
                }
            )
        )


if __name__ == "__main__":
    main()
