"""Summarised runs without training, for tests of a plan's judgement."""

from __future__ import annotations

import numpy as np


def fake_runs(means: dict[tuple[str, str], float], seeds, rng: np.random.Generator) -> list[dict]:
    """Each (condition, arm)'s runs on ``seeds``, their completion AUC its mean plus a little noise."""
    return [
        {
            "condition": c,
            "arm": a,
            "seed": s,
            "summary": {"completion_auc": m + rng.normal(0, 0.01), "final_completion": m, "steps_to_complete": 1e6},
        }
        for (c, a), m in means.items()
        for s in seeds
    ]
