"""The term interface is declared: `SyncedTerm`'s three methods, and each optional capability a
protocol of its own in ``collector/seam.py`` that the syncers and the learner look for by type."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from redisync.collector import seam

ROOT = Path(__file__).resolve().parents[2]


def _members(protocol: type) -> set[str]:
    return {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))


def test_no_capability_is_looked_up_by_a_name_spelled_in_the_runtime():
    """No ``getattr``/``hasattr`` of a declared capability's member in the package: each is found by
    ``isinstance`` against its protocol, so renaming one is a type error, not a silent skip."""
    names = set().union(*(_members(p) for p in seam.CAPABILITIES)) | {"fleet_metrics", "fleet_probabilities"}
    pattern = re.compile(r"\b(?:getattr|hasattr)\(\s*\w+\s*,\s*[\"'](\w+)[\"']")
    found = [
        (path.relative_to(ROOT).as_posix(), name)
        for path in (ROOT / "redisync").rglob("*.py")
        for name in pattern.findall(path.read_text())
        if name in names
    ]
    assert found == []


@pytest.mark.extras("torch")
def test_the_built_in_terms_declare_their_capabilities_and_a_plain_term_has_none():
    """The torch sampler and normaliser have every capability they implement (the normaliser's
    metrics: how far its mean is off the fleet's); a term of a user's own
    with the three methods alone is a `SyncedTerm` and has none."""
    from redisync.terms.torch.normalization import SyncedEmpiricalNormalization
    from redisync.terms.torch.sampler import AdaptiveMotionSampler

    sampler = AdaptiveMotionSampler(100, 0.02)
    assert {p.__name__ for p in seam.CAPABILITIES if isinstance(sampler, p)} == {p.__name__ for p in seam.CAPABILITIES}
    norm = SyncedEmpiricalNormalization(3)
    assert {p.__name__ for p in seam.CAPABILITIES if isinstance(norm, p)} == {
        "Prepares", "Settles", "CountsDeviceCopies", "SharesReport", "SharesFleet", "HasMetrics", "Resumes",
    }  # fmt: skip  # (HasMetrics: drift_offset_sd where it pools or observes)

    class Plain:
        def schema_entries(self):
            return {}

        def report_shard_state(self):
            return {}

        def apply_shard_state(self, fleet):
            return None

    assert isinstance(Plain(), seam.SyncedTerm)
    assert not any(isinstance(Plain(), p) for p in seam.CAPABILITIES)
