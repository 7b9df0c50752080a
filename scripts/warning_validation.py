#!/usr/bin/env python
"""The drift warning judged out of sample, as docs/ab/warning-validation-plan.md fixes it: the threshold
T frozen in records/ab/warning-threshold-<date>.json, the held-out configurations labelled by the model
(drift: a shard distance of at least 0.15), the shape-blind rule (fires at a predicted shard distance of
at least T) and today's rule (formulas.ema_warning with the fleet taken as N × the shard's own EMA),
each one's sensitivity and specificity against the target, and the toy's run-labelled arms. Writes
records/ab/warning-validation.json and .md.

    .venv/bin/python scripts/warning_validation.py
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warning_threshold as training  # (the plan's truth and rule, shared)

ROOT = Path(__file__).resolve().parents[1]
TARGET, PER_CLASS = 0.8, 5
FLEETS = [(4, 16), (4, 64), (16, 256), (32, 32)]
EXTENSIONS = [(4, 8), (4, 128), (16, 512), (32, 16)]
RATES_BINS = [(0.003, 60), (0.01, 120)]
SHAPES = [(3, 10.0), (6, 3.0)]


def todays_rule_fires(shards: int, envs: int, alpha: float, bins: int, measured: float) -> bool:
    from redisync.terms.formulas import ema_statistics, ema_warning

    mass = measured * envs
    own = ema_statistics(mass, bins, alpha, 0.1, "code")
    fleet = ema_statistics(shards * mass, bins, alpha, 0.1, "code")
    return ema_warning(own, fleet, "") is not None


def judge(fleets: list[tuple[int, int]], threshold: float) -> list[dict]:
    rows = []
    for (shards, envs), (alpha, bins), (hard, ratio) in itertools.product(fleets, RATES_BINS, SHAPES):
        truth, measured, predicted = training.truth_and_rule(shards, envs, alpha, bins, hard, ratio)
        rows.append({
            "shards": shards, "envs_per_shard": envs, "alpha": alpha, "bins": bins, "hard_bins": hard,
            "hard_ratio": ratio, "truth": truth, "drifts": truth >= training.DRIFT,
            "measured_failure_rate": measured, "predicted": predicted, "rule_fires": predicted >= threshold,
            "todays_rule_fires": todays_rule_fires(shards, envs, alpha, bins, measured),
        })  # fmt: skip
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def rates(rows: list[dict], key: str) -> dict:
    pos = [r for r in rows if r["drifts"]]
    neg = [r for r in rows if not r["drifts"]]
    return {
        "sensitivity": sum(r[key] for r in pos) / len(pos) if pos else float("nan"),
        "specificity": sum(not r[key] for r in neg) / len(neg) if neg else float("nan"),
        "positives": len(pos),
        "negatives": len(neg),
    }


def toy_arms(threshold: float) -> list[dict]:
    """The second follow-up's unsynced arms: harm as its tests labelled it, and each rule's decision
    at the failure rate its shards measured (the median over the run's drift records)."""
    results = json.loads((ROOT / "records" / "ab" / "second-follow-up" / "results.json").read_text())
    harm = {}
    for c in results["second_follow_up"]:
        if c["question"] == "C":
            arm = c["contrast"].split(": ")[1].split(" − ")[0]
            harm[arm] = "harm" if c["hi"] < 0 else ("no harm" if c["lo"] > -0.03 and c["hi"] < 0.03 else "unlabelled")
    out = []
    for arm, label in harm.items():
        files = sorted((ROOT / "records" / "ab" / "second-follow-up" / "runs").glob(f"H-{arm}-3*.json"))
        masses, shards = [], None
        for f in files:
            run = json.loads(f.read_text())["run"]
            shards = run["shards"]
            masses += [float(np.mean([e["failures_per_bin_window"] for e in d["ema"]])) * 121 * 0.01
                       for d in run["drift"] if d.get("ema")]  # fmt: skip
        envs = 1024 // shards
        measured = float(np.median(masses)) / envs
        from redisync.terms.drift_model import predict

        rule = predict(training.model_of(shards, envs, 0.01, 121, measured, 0, 1.0)).local.shard_distance
        out.append({"arm": arm, "shards": shards, "envs_per_shard": envs, "label": label,
                    "measured_failure_rate": measured, "predicted": rule, "rule_fires": rule >= threshold,
                    "todays_rule_fires": todays_rule_fires(shards, envs, 0.01, 121, measured)})  # fmt: skip
    return out


def main() -> None:
    frozen = sorted((ROOT / "records" / "ab").glob("warning-threshold-*.json"))[-1]
    threshold = json.loads(frozen.read_text())["threshold"]
    fleets = list(FLEETS)
    rows = judge(fleets, threshold)
    for extra in EXTENSIONS:
        counts = rates(rows, "rule_fires")
        if counts["positives"] >= PER_CLASS and counts["negatives"] >= PER_CLASS:
            break
        fleets.append(extra)
        rows += judge([extra], threshold)
    new, old = rates(rows, "rule_fires"), rates(rows, "todays_rule_fires")
    met = new["sensitivity"] >= TARGET and new["specificity"] >= TARGET
    enough = new["positives"] >= PER_CLASS and new["negatives"] >= PER_CLASS
    out = {"threshold": threshold, "threshold_file": frozen.name, "rows": rows, "rule": new, "todays_rule": old,
           "target": TARGET, "enough_per_class": enough, "target_met": met and enough,
           "toy_arms": toy_arms(threshold)}  # fmt: skip
    (ROOT / "records" / "ab" / "warning-validation.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({k: out[k] for k in ("threshold", "rule", "todays_rule", "target_met")}, indent=1))


if __name__ == "__main__":
    main()
