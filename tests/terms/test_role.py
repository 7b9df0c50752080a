"""A term's role in the fleet (`redisync.terms.role`): every mode of every term maps to one role,
and what each term declares and reports is what its role says."""

from __future__ import annotations

import typing
from collections.abc import Callable

import numpy as np
import pytest

from redisync.store.schema import MEASURED_DRIFT_SUFFIX
from redisync.terms import numpy as np_terms
from redisync.terms import torch as torch_terms
from redisync.terms.role import MODES, Role, role_of

# each term, built for a mode and whether this shard leads (a broadcast's owner, the learner's writer)
TERMS: dict[str, tuple[type, Callable[[str, bool], object]]] = {
    "torch sampler": (
        torch_terms.AdaptiveMotionSampler,
        lambda mode, leads: torch_terms.AdaptiveMotionSampler(20, 0.1, mode=mode, shard_id=0 if leads else 1),
    ),
    "numpy failure EMA": (
        np_terms.FailureEma,
        lambda mode, leads: np_terms.FailureEma(np.zeros(4), mode=mode, shard_id=0 if leads else 1),
    ),
    "torch normaliser": (
        torch_terms.SyncedEmpiricalNormalization,
        lambda mode, leads: torch_terms.SyncedEmpiricalNormalization(3, mode=mode, writer=leads),
    ),
    "numpy normaliser": (np_terms.EmpiricalNormalizer, lambda mode, leads: np_terms.EmpiricalNormalizer(3, mode=mode)),
    "episode length": (
        torch_terms.AverageEpisodeLength,
        lambda mode, leads: torch_terms.AverageEpisodeLength(16, mode=mode, shard_id=0 if leads else 1),
    ),
    "penalty": (
        torch_terms.PenaltyCurriculum,
        lambda mode, leads: torch_terms.PenaltyCurriculum(mode=mode, shard_id=0 if leads else 1),
    ),
    "terrain": (torch_terms.TerrainLevels, lambda mode, leads: torch_terms.TerrainLevels(8, 4, mode=mode)),
}


def _modes(cls: type) -> tuple[str, ...]:
    """The modes a term offers, read from its constructor's ``mode`` annotation."""
    return typing.get_args(typing.get_type_hints(cls.__init__)["mode"])


CASES = [
    (name, mode, leads)
    for name, (cls, _) in TERMS.items()
    for mode in _modes(cls)
    for leads in (True, False)
    if leads or name not in ("numpy normaliser", "terrain")  # (no leader: every shard is alike)
]


def test_every_mode_a_term_offers_has_a_role():
    """No term offers a mode the table does not map (a new mode is mapped once, there)."""
    offered = {mode for cls, _ in TERMS.values() for mode in _modes(cls)}
    assert offered <= set(MODES)
    assert offered == set(MODES)  # and the table maps no mode that no term offers


def test_the_roles_properties_agree():
    """A role syncs iff it declares a key, and a synced role reports, receives, or both."""
    for role in Role:
        assert role.syncs == (role.semantics is not None)
        assert role.syncs == (role.reports or role.receives)
    assert role_of("broadcast", leads=True) is Role.LEADS
    assert role_of("learner", leads=False) is Role.FOLLOWS
    assert role_of("local", leads=True) is role_of("local", leads=False) is Role.ALONE


@pytest.mark.parametrize(("name", "mode", "leads"), CASES)
def test_a_term_declares_and_reports_what_its_role_says(name, mode, leads):
    """The key's semantics is the role's, and the report carries something iff the role reports."""
    term = TERMS[name][1](mode, leads)
    role = term.role
    assert role is role_of(mode, leads=leads)
    declared = dict(term.schema_entries())
    measured = [declared.pop(n) for n in list(declared) if n.endswith(MEASURED_DRIFT_SUFFIX)]
    assert [spec.semantics for spec in declared.values()] == ([role.semantics] if role.syncs else [])
    assert not measured or role is Role.OBSERVES  # (an observing sampler reports the drift it measures)
    assert bool(term.report_shard_state()) == role.reports
