"""``bench --churn`` in miniature: the figures are produced, every id that passed is forgotten, every
sample that passed is counted, and the run's memory ends near its live slots'."""

from __future__ import annotations

import pytest

from redisync.bench.churn import format_churn, run_churn

pytestmark = pytest.mark.integration  # a redis-server of the bench's own (and callgrind, where installed)


def test_the_churn_forgets_every_departed_id_and_keeps_every_sample():
    """150 ids through 6 live collectors: every one forgotten, every sample counted, the memory near
    the live slots', and the figures printed."""
    r = run_churn(ids=150, live=6, grace_s=0.5, folds=3)
    assert r["shard_ids_left"] == 6
    assert r["forgotten_ids"] == 150
    assert r["count_pooled"] == r["count_reported"]
    # (the retired planes and the run's counters are what the departed ids leave behind)
    assert r["memory_after"]["state_bytes"] < 1.25 * r["memory_live"]["state_bytes"]
    text = format_churn(r)
    assert "graces passed" in text
    assert "samples counted" in text
