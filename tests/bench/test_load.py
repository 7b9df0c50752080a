"""``bench --load`` in miniature: the generated folds are applied and exact, both designs measured,
and a capacity the run did not reach is labelled an extrapolation."""

from __future__ import annotations

import pytest

from redisync.bench.load import fold_load, format_load, plain_load, private_server

pytestmark = pytest.mark.integration  # a redis-server of its own


def test_the_generator_folds_exactly_and_the_table_says_what_was_reached():
    """Pre-encoded folds of 8 shards, resent with the next sequence number: every one applied, the
    fleet the exact sum of every shard's last report; the plain design's pooled blob exact too."""
    with private_server() as url:
        ours = fold_load(url, 8, 0.5, depth=8)
        plain = plain_load(url, 8, 0.5, depth=8)
    assert ours["exact"]
    assert plain["exact"]
    assert ours["reports"] >= 8
    assert ours["reports"] % 8 == 0
    assert ours["server_ms_per_report"] > 0
    assert plain["server_ms_per_report"] > 0
    text = format_load({"date": "d", "cpus": 2, "load_average": (0.0,), "rows": [ours, plain]})
    assert text.count("| redisync | 8 |") == 1
    assert text.count("| plain HSET / pool / GET | 8 |") == 1
    # a capacity above the rate reached is an extrapolation, and says from what
    table = {"date": "d", "cpus": 2, "load_average": (0.0,)}
    slow = dict(ours, slots=64, per_collector_hz=0.5, reached_1hz=False, collectors_within_budget=40.0)
    assert "40 (extrapolated from 64 collectors at 0.50 Hz)" in format_load(table | {"rows": [slow]})
    few = dict(ours, slots=64, per_collector_hz=7.0, reached_1hz=True, collectors_within_budget=400.0)
    assert "400 (extrapolated from 64 collectors at 7.00 Hz)" in format_load(table | {"rows": [few]})
    enough = dict(ours, slots=256, per_collector_hz=1.2, reached_1hz=True, collectors_within_budget=250.0)
    assert "| 250 |" in format_load(table | {"rows": [enough]})


def test_subscribed_collectors_hear_every_fold_without_a_window_and_one_per_window_with_one():
    """With every collector subscribed: without a window each fold is announced to each of them (the
    deliveries grow with folds × collectors); with one, at most one announcement per window of the run
    reached it, whatever the folds."""
    with private_server() as url:
        every = fold_load(url, 8, 0.5, depth=8, subscribed=True)
        windowed = fold_load(url, 8, 0.5, depth=8, window_s=0.05, subscribed=True)
    assert every["announcements_per_s"] * every["seconds"] == pytest.approx(every["reports"])
    assert every["deliveries_per_s"] == pytest.approx(8 * every["announcements_per_s"])
    assert windowed["reports"] > windowed["seconds"] / 0.05 + 1  # more folds than windows ...
    assert windowed["announcements_per_s"] * windowed["seconds"] <= windowed["seconds"] / 0.05 + 1  # ... one each
    text = format_load({"date": "d", "cpus": 2, "load_average": (0.0,), "rows": [], "fanout": [every, windowed]})
    assert "| 8 | every fold |" in text
    assert "| 8 | 50 ms |" in text
