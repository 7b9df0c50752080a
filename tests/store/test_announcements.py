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


class Count:
    """A follower's term: it reports nothing and keeps the fleet's count as last applied."""

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


def test_paying_a_debt_is_bound_by_the_window_too(real_url, run_named):
    """A debt paid before the window since the last announcement has passed announces nothing and
    says how long is left; paid after, it announces (was: a payment announced whenever it came, so
    concurrent folds' timers exceeded the window's bound)."""
    store = run_named(Limits(announce_every_s=1.0))
    store._pay_later = lambda delay_us: None  # (its own timer would pay the debt: this test pays it)
    shards = [store.shard(k) for k in range(2)]
    shards[0].publish({"obs/n": {"count": 1.0, "sum": [1.0]}})  # announced: the window opens
    shards[1].publish({"obs/n": {"count": 2.0, "sum": [1.0]}})  # inside it: owed
    wait = store.owed_wait_s()
    assert wait is not None
    assert 0 < wait <= 1.0
    assert store.announce_owed() is False  # too early: nothing announced, still owed
    time.sleep(wait + 0.05)
    assert store.announce_owed() is True
    assert store.owed_wait_s() is None  # paid


def test_the_announcements_of_concurrent_folds_stay_within_the_window(real_url, run_named):
    """Four clients folding as fast as they can for 2 s at a 0.2 s window: the announcements heard
    are at most one per window of the server's own clock over the whole burst and its debt's payment
    (counted, not timed on the client: a loaded machine delays what the listener reads, not what the
    server sent), and the burst's last version is announced."""
    import threading

    store = run_named(Limits(announce_every_s=0.2))
    stores = [redisync.connect(real_url, run=store.run) for _ in range(4)]
    sub = redis.Redis.from_url(real_url).pubsub()
    sub.ssubscribe(store.keys.channel)
    assert wait_for(lambda: sub.get_message(timeout=0.1) is not None)
    heard_at: list[tuple[float, int]] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            message = sub.get_message(timeout=0.05)
            if message and message["type"] == "smessage":
                heard_at.append((time.monotonic(), int(message["data"].split()[0])))

    def fold(k: int) -> None:
        shard, end, n = stores[k].shard(k), time.monotonic() + 2.0, 0
        while time.monotonic() < end:
            n += 1
            shard.publish({"obs/n": {"count": float(n), "sum": [1.0]}})

    listener = threading.Thread(target=listen)
    started_us = store.leases().now_us  # (the server's clock)
    listener.start()
    folders = [threading.Thread(target=fold, args=(k,)) for k in range(4)]
    for t in folders:
        t.start()
    for t in folders:
        t.join()
    time.sleep(0.6)  # the last window's debt paid
    stop.set()
    listener.join()
    sub.close()
    for s in stores:
        s.close()
    served_s = (store.leases().now_us - started_us) / 1e6
    assert len(heard_at) <= served_s / 0.2 + 1, (len(heard_at), served_s)  # one per window (was: about 1.5 times)
    assert heard_at[-1][1] == store.fleet().fleet_version  # the last version announced


def test_a_debt_whose_debtor_died_is_found_by_a_follower_when_the_window_closes(real_url, run_named):
    """The process whose fold left the announcement owed is gone before paying (a sidecar stopped, a
    SIGKILL): a subscribed follower that polls once a minute still applies the burst's last version,
    by its one look when the window it heard open closes (it waited for the next fold, for ever on a
    quiet fleet)."""

    store = run_named(Limits(announce_every_s=1.0))
    term = Count()
    follower = redisync.new_syncer(store, 99, [term], worker="thread", poll_every_s=60.0).start()
    try:
        assert follower.wait_synced(timeout=10)
        debtor = redisync.connect(real_url, run=store.run)
        debtor._pay_later = lambda delay_us: None  # dies before its timer fires: it never pays
        shards = [debtor.shard(k) for k in range(2)]
        shards[0].publish({"obs/n": {"count": 3.0, "sum": [1.0]}})  # announced: the window opens
        assert wait_for(lambda: (follower.at_reset_boundary(), term.fleet == 3.0)[1], timeout=10)
        shards[1].publish({"obs/n": {"count": 4.0, "sum": [1.0]}})  # inside the window: owed, never paid
        assert wait_for(lambda: (follower.at_reset_boundary(), term.fleet == 7.0)[1], timeout=10)
        debtor.close()
    finally:
        follower.stop()
