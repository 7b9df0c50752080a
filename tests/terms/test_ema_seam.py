"""The failure-EMA seam, once for both samplers (`redisync.terms.ema_seam`): by mode, the key
declared, the report made and the fleet part read, each mode through its role."""

from __future__ import annotations

import numpy as np
import pytest

from redisync.store.codec import KeyView
from redisync.store.schema import Schema
from redisync.terms import ema_seam
from redisync.terms.role import role_of

KEY = "motion/bin_failed"
OWN = np.array([0.5, 0.25, 0.0])


def _role(mode: str, shard: int = 0, owner: int = 2):
    return role_of(mode, leads=shard == owner)


def _declared(mode: str) -> dict:
    return ema_seam.declared(_role(mode), KEY, 3, owner=2, stale_after_s=30.0, lifecycle="state")


def test_each_mode_declares_its_semantics_and_only_pooled_drops_stale_slots():
    """local: nothing; broadcast: the owner's value; pooled and weighted: a merge key (a stale slot
    leaves pooled only: weighted's counts are the failures behind a report)."""
    assert _declared("local") == {}
    assert _declared("broadcast")[KEY].semantics == "broadcast"
    assert _declared("broadcast")[KEY].owner == 2
    pooled, weighted = _declared("pooled")[KEY], _declared("weighted")[KEY]
    assert (pooled.semantics, weighted.semantics) == ("merge", "merge")
    assert pooled.stale_after_s == 30.0
    assert weighted.stale_after_s is None
    assert pooled.lifecycle == weighted.lifecycle == "state"


@pytest.mark.parametrize(
    ("mode", "shard", "want"),
    [
        ("pooled", 0, {KEY: {"count": 1.0, "sum": OWN}}),
        ("weighted", 0, {KEY: {"count": 4.0, "sum": 4.0 * OWN}}),
        ("broadcast", 2, {KEY: {"value": OWN}}),
        ("broadcast", 0, {}),
        ("local", 0, {}),
    ],
)
def test_the_report_is_the_shards_own_ema_as_its_mode_counts_it(mode, shard, want):
    """pooled: one slot of count 1; weighted: the failures behind it as its count; broadcast: the owner only."""
    got = ema_seam.report(_role(mode, shard), KEY, OWN, count=4.0)
    assert got.keys() == want.keys()
    for key, parts in want.items():
        assert got[key].keys() == parts.keys()
        for part, value in parts.items():
            np.testing.assert_array_equal(got[key][part], value)


def test_the_fleet_part_is_the_others_sum_when_pooled_and_the_owners_value_when_broadcast():
    """pooled: the aggregate without the shard's own slot as folded; broadcast: the owner's value, and
    only a receiver follows the fleet."""
    spec = Schema.of(_declared("pooled")).keys[KEY]
    mine = np.concatenate([[1.0], OWN])
    aggregate = mine + np.concatenate([[2.0], [1.0, 1.0, 1.0]])
    view = KeyView(KEY, spec, 3, aggregate, own_slot=mine, own_incarnation=1)
    np.testing.assert_array_equal(ema_seam.fleet_part(_role("pooled"), view), [1.0, 1.0, 1.0])
    owners = KeyView(KEY, Schema.of(_declared("broadcast")).keys[KEY], 1, np.array([0.1, 0.2, 0.3]))
    np.testing.assert_array_equal(ema_seam.fleet_part(_role("broadcast"), owners), [0.1, 0.2, 0.3])
    assert ema_seam.follows_fleet(_role("pooled"))
    assert ema_seam.follows_fleet(_role("broadcast", 0))
    assert not ema_seam.follows_fleet(_role("broadcast", 2))  # the owner samples from its own
    assert not ema_seam.follows_fleet(_role("local"))
    assert not ema_seam.follows_fleet(_role("weighted"))
