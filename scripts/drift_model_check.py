#!/usr/bin/env python
"""The model of the sampler (redisync.terms.drift_model) against the committed toy runs: for the last
drift record of every local arm's run of the second follow-up (16 x 64, 8 x 128, 4 x 256 envs, alpha
0.01, 121 bins), the model's mean distance of a shard's start distribution from the pooled one,
beside the distance the run recorded.

The model is given what the record holds (the shards' mean failure mass, hence the failures per env
per step), the run's configuration, and the toy task's shape: three skill segments, each HARD_RATIO
times as hazardous as a plain bin (not recorded by the runs; 100 was fixed after looking at 30 and 300
on three seeds of each arm), 10 s episodes at 50 Hz. Writes records/advise/model-vs-toy-runs-<date>.json.

    .venv/bin/python scripts/drift_model_check.py
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "records" / "ab" / "second-follow-up" / "runs"
ARMS = ("local-16-shards", "local-8-shards", "local")
HARD_RATIO = 100.0
BINS, ALPHA, EPISODE_STEPS, EPISODE_BINS = 121, 0.01, 500, 10


def record_inputs(path: Path) -> dict:
    """What the model is given for a run: its shards, envs per shard and the last record's failure rate."""
    run = json.loads(path.read_text())["run"]
    shards = run["shards"]
    record = [d for d in run["drift"] if d["ema"] and d["tv"]][-1]
    mass = float(np.mean([e["failures_per_bin_window"] for e in record["ema"]])) * BINS * ALPHA
    return {
        "file": path.name,
        "arm": run["arm"],
        "seed": run["seed"],
        "shards": shards,
        "envs_per_shard": 1024 // shards,
        "env_steps": record["env_steps"],
        "failure_rate": mass / (1024 // shards),
        "recorded_shard_distance": float(np.mean(record["tv"])),
    }


def predicted(inputs: dict) -> float:
    from redisync.terms.drift_model import FleetModel, predict, profile

    rate = inputs["failure_rate"]
    start = 1 / EPISODE_STEPS + rate
    hazard, hard = profile(BINS, rate, start_rate=start, episode_bins=EPISODE_BINS, hard_bins=3, hard_ratio=HARD_RATIO)
    model = FleetModel(
        inputs["shards"], inputs["envs_per_shard"], hazard, alpha=ALPHA, start_rate=start,
        episode_bins=EPISODE_BINS, hard=hard,
    )  # fmt: skip
    return predict(model).local.shard_distance


def main() -> None:
    from scipy.stats import spearmanr

    rows = []
    for arm in ARMS:
        for path in sorted(RUNS.glob(f"H-{arm}-3*.json")):
            inputs = record_inputs(path)
            inputs["predicted_shard_distance"] = predicted(inputs)
            rows.append(inputs)
            print(inputs, file=sys.stderr, flush=True)
    pred = [r["predicted_shard_distance"] for r in rows]
    seen = [r["recorded_shard_distance"] for r in rows]
    rho = float(spearmanr(pred, seen)[0])
    by_arm = {
        arm: {
            "predicted": float(np.mean([r["predicted_shard_distance"] for r in rows if r["arm"] == arm])),
            "recorded": float(np.mean([r["recorded_shard_distance"] for r in rows if r["arm"] == arm])),
        }
        for arm in ARMS
    }
    out = {
        "date": datetime.date.today().isoformat(),
        "hard_ratio": HARD_RATIO,
        "records": rows,
        "spearman": rho,
        "mean_absolute_error": float(np.mean(np.abs(np.array(pred) - np.array(seen)))),
        "by_arm": by_arm,
    }
    path = ROOT / "records" / "advise" / f"model-vs-toy-runs-{out['date']}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"{path}: spearman {rho:.2f}, by arm {by_arm}")


if __name__ == "__main__":
    main()
