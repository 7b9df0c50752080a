"""A run's new versions are announced on its channel: every fold by default, at most once per the
run's window when it sets one, and then a burst's last version is announced too (the fold that
left it owed has its caller pay it once the window has passed)."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

import redisync
from redisync import merge
from redisync.store.schema import Limits, Schema

from ..support import wait_for

SCHEMA = Schema.of({"obs/n": merge(1, lifecycle="history")})


@pytest.fixture
def run_named(real_url):
    made = []

    def make(limits: Limits) -> redisync.store.client.Store:
        store = redisync.connect(real_url, run=f"t-{uuid.uuid4().hex[:12]}")
        store.register(SCHEMA, limits)
        made.append(store)
        return store

    yield make
    for store in made:
        store.delete()


def heard(real_url: str, store, burst) -> list[int]:
    """The versions announced on ``store``'s channel while ``burst()`` runs and a second after."""
    sub = redis.Redis.from_url(real_url).pubsub()
    sub.ssubscribe(store.keys.channel)
    assert wait_for(lambda: sub.get_message(timeout=0.1) is not None)  # the confirmation
    burst()
    time.sleep(1.0)
    out = []
    while (message := sub.get_message(timeout=0.1)) is not None:
        if message["type"] == "smessage":
            out.append(int(message["data"].split()[0]))
    sub.close()
    return out


def fold_burst(store, folds: int = 30, every_s: float = 0.0) -> None:
    shards = [store.shard(k) for k in range(5)]
    for i in range(folds):
        shards[i % 5].publish({"obs/n": {"count": float(i), "sum": [1.0]}})
        time.sleep(every_s)


def test_every_fold_is_announced_by_default(real_url, run_named):
    """Without a window, each of 30 folds announces its own version, in order."""
    store = run_named(Limits())
    assert heard(real_url, store, lambda: fold_burst(store)) == list(range(1, 31))


def test_a_window_coalesces_a_burst_and_still_announces_its_last_version(real_url, run_named):
    """With ``announce_every_s=0.5`` a burst of 30 folds (well inside one window) is announced at
    most twice: its first version, and its last once the window has passed."""
    store = run_named(Limits(announce_every_s=0.5))
    assert store.limits().announce_every_s == 0.5
    versions = heard(real_url, store, lambda: fold_burst(store))
    assert 1 <= len(versions) <= 2
    assert versions[-1] == 30
    assert store.announce_owed() is False  # paid: nothing left owed


def test_a_follower_learns_a_bursts_last_version_without_polling(real_url, run_named):
    """A collector that polls once a minute applies the last version of a coalesced burst (spread
    over half a second, longer than its pulls' spacing, inside one window) within a few seconds:
    the owed announcement reached it."""

    class Count:
        key = "obs/n"

        def __init__(self):
            self.fleet = None

        def schema_entries(self):
            return SCHEMA.keys

        def report_shard_state(self):
            return {}

        def apply_shard_state(self, fleet):
            view = fleet.keys.get(self.key)
            if view is not None and view.value is not None:
                self.fleet = float(view.parts()["count"])

    store = run_named(Limits(announce_every_s=1.0))
    term = Count()
    follower = redisync.new_syncer(store, 99, [term], worker="thread", poll_every_s=60.0).start()
    try:
        assert follower.wait_synced(timeout=10)  # (it wakes the worker: not after the burst)
        fold_burst(store, folds=10, every_s=0.05)  # the last report: shard 4, count 9; every shard's last: 5+6+7+8+9
        assert wait_for(lambda: (follower.at_reset_boundary(), term.fleet == 35.0)[1], timeout=5)
        assert term.fleet == 35.0
    finally:
        follower.stop()
