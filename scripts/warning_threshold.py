#!/usr/bin/env python
"""The drift warning's threshold T, chosen on the training grid as docs/ab/warning-validation-plan.md
fixes it: on every training configuration the truth (the model's shard distance with three hard bins),
its drift label (at least DRIFT), the failure rate a shard measures there and the shape-blind rule's
prediction from it, and the T that maximises sensitivity + specificity (ties: the larger T). Writes
records/ab/warning-threshold-<date>.json.

    .venv/bin/python scripts/warning_threshold.py
"""

from __future__ import annotations

import datetime
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DRIFT = 0.15
SHARDS, ENVS, ALPHAS, BINS = (2, 8, 32), (16, 64, 256), (0.001, 0.01), (30, 120)
FAILURE_RATE, HARD_BINS, HARD_RATIO, EPISODE_STEPS, EPISODE_BINS = 0.002, 3, 10.0, 500, 10


def model_of(shards: int, envs: int, alpha: float, bins: int, rate: float, hard_bins: int, ratio: float):
    from redisync.terms.drift_model import FleetModel, profile

    start = 1 / EPISODE_STEPS + rate
    hazard, hard = profile(bins, rate, start_rate=start, episode_bins=EPISODE_BINS, hard_bins=hard_bins,
                           hard_ratio=ratio)  # fmt: skip
    return FleetModel(shards, envs, hazard, alpha=alpha, start_rate=start, episode_bins=EPISODE_BINS, hard=hard)


def truth_and_rule(shards: int, envs: int, alpha: float, bins: int, hard_bins: int = HARD_BINS,
                   ratio: float = HARD_RATIO) -> tuple[float, float, float]:  # fmt: skip
    """The truth's shard distance, the failure rate a shard measures there, and the shape-blind rule's
    predicted shard distance from that rate."""
    from redisync.terms.drift_model import predict

    truth = predict(model_of(shards, envs, alpha, bins, FAILURE_RATE, hard_bins, ratio))
    measured = truth.local.ema_mass / envs
    rule = predict(model_of(shards, envs, alpha, bins, measured, 0, 1.0))
    return truth.local.shard_distance, measured, rule.local.shard_distance


def choose(rows: list[dict]) -> dict:
    """The T among the predicted values (and just above the largest) maximising sensitivity + specificity."""
    positives = [r for r in rows if r["drifts"]]
    negatives = [r for r in rows if not r["drifts"]]
    best = None
    for t in sorted({r["predicted"] for r in rows} | {max(r["predicted"] for r in rows) + 1e-9}):
        sens = sum(r["predicted"] >= t for r in positives) / max(len(positives), 1)
        spec = sum(r["predicted"] < t for r in negatives) / max(len(negatives), 1)
        if best is None or sens + spec >= best["sensitivity"] + best["specificity"]:
            best = {"threshold": t, "sensitivity": sens, "specificity": spec}
    assert best is not None
    return best


def main() -> None:
    rows = []
    for shards, envs, alpha, bins in itertools.product(SHARDS, ENVS, ALPHAS, BINS):
        truth, measured, rule = truth_and_rule(shards, envs, alpha, bins)
        rows.append({"shards": shards, "envs_per_shard": envs, "alpha": alpha, "bins": bins, "truth": truth,
                     "measured_failure_rate": measured, "predicted": rule, "drifts": truth >= DRIFT})  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    out = {"date": datetime.date.today().isoformat(), "drift": DRIFT, "rows": rows, **choose(rows)}
    path = ROOT / "records" / "ab" / f"warning-threshold-{out['date']}.json"
    path.write_text(json.dumps(out, indent=1))
    print(f"{path}: T = {out['threshold']:.4f}")


if __name__ == "__main__":
    main()
