"""A model-based test of a run's announcement window: hypothesis drives the events a fleet lives
through — folds by several clients, a fold whose process dies (or stops) before paying what it left
owed, quiet spells shorter and longer than the window — while two followers that poll once a minute
listen. Whenever the fleet has been quiet for a window, every follower has applied the exact fleet
(the sum of every shard's last report) and the run owes nothing (a follower's look at the window's
end paid a dead debtor's debt); at every step the announcements heard are at most one per window
of the server's clock, plus the first."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

import redisync
from redisync.store.schema import Limits

from ..conftest import examples, real_redis_or_skip
from ..support import wait_for
from .test_announcements import SCHEMA, Count

WINDOW_S = 0.1
CLIENTS = 3


class AnnouncementLife(RuleBasedStateMachine):
    """The model: each shard's last reported count (the fleet's count is their sum)."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url

    @initialize()
    def start(self) -> None:
        self.store = redisync.connect(self.url, run=f"t-ann-{uuid.uuid4().hex[:10]}")
        self.store.register(SCHEMA, Limits(announce_every_s=WINDOW_S))
        self.clients = [redisync.connect(self.url, run=self.store.run) for _ in range(CLIENTS)]
        self.shards = [c.shard(k) for k, c in enumerate(self.clients)]
        self.last: dict[int, float] = {}
        self.counted = 0.0
        self.terms = [Count(), Count()]
        self.followers = [
            redisync.new_syncer(self.store, 100 + i, [t], worker="thread", poll_every_s=60.0).start()
            for i, t in enumerate(self.terms)
        ]
        for f in self.followers:
            assert f.wait_synced(timeout=30)
        self.heard = 0
        self.listening = threading.Event()
        self.sub = redis.Redis.from_url(self.url).pubsub()
        self.sub.ssubscribe(self.store.keys.channel)
        assert wait_for(lambda: self.sub.get_message(timeout=0.1) is not None)  # the confirmation
        self.started_us = self.store.leases().now_us  # the server's clock
        self.listener = threading.Thread(target=self._listen, daemon=True)
        self.listener.start()

    def _listen(self) -> None:
        while not self.listening.is_set():
            message = self.sub.get_message(timeout=0.05)
            if message and message["type"] == "smessage":
                self.heard += 1

    def _fold(self, k: int, pays: bool) -> None:
        self.counted += 1.0
        self.last[k] = self.counted
        client = self.clients[k]
        if not pays:  # its process dies, or stops, before its timer pays what this fold left owed
            client._pay_later = lambda delay_us: None
        try:
            self.shards[k].publish({"obs/n": {"count": self.counted, "sum": [1.0]}})
        finally:
            client.__dict__.pop("_pay_later", None)

    @rule(k=st.integers(0, CLIENTS - 1))
    def fold(self, k: int) -> None:
        self._fold(k, pays=True)

    @rule(k=st.integers(0, CLIENTS - 1))
    def fold_then_die_before_paying(self, k: int) -> None:
        self._fold(k, pays=False)

    @rule(k=st.integers(0, CLIENTS - 1), folds=st.integers(2, 6))
    def burst(self, k: int, folds: int) -> None:
        """Folds inside one window, the last one's process dying before it pays."""
        for i in range(folds):
            self._fold((k + i) % CLIENTS, pays=i < folds - 1)

    @rule(seconds=st.sampled_from([0.0, 0.02, 0.05]))
    def short_pause(self, seconds: float) -> None:
        time.sleep(seconds)

    @rule()
    def quiet_for_a_window(self) -> None:
        """The fleet makes no call for longer than the window: every follower applies the exact fleet,
        and nothing stays owed (decided by what the followers hold and the meta says, within a bound
        generous for a loaded machine, never by how fast)."""
        time.sleep(WINDOW_S)
        want = sum(self.last.values())
        if self.last:
            for follower, term in zip(self.followers, self.terms, strict=True):
                applied = lambda f=follower, t=term: (f.at_reset_boundary(), t.fleet == want)[1]  # noqa: E731
                assert wait_for(applied, timeout=20), (term.fleet, want)
        assert wait_for(
            lambda: self.store.redis.hget(self.store.keys.meta, "announce_owed") in (None, b"0"), timeout=20
        )

    @invariant()
    def at_most_one_announcement_per_window(self) -> None:
        if not hasattr(self, "started_us"):
            return
        served_s = (self.store.leases().now_us - self.started_us) / 1e6
        assert self.heard <= served_s / WINDOW_S + 1, (self.heard, served_s)

    def teardown(self) -> None:
        if not hasattr(self, "store"):
            return
        self.listening.set()
        self.listener.join()
        self.sub.close()
        for f in self.followers:
            f.stop()
        for c in self.clients:
            c.close()
        self.store.delete()


@pytest.mark.slow
def test_announcement_windows_through_a_fleets_life():
    """Random lives of a run with an announcement window: followers that do not poll always end
    with the exact fleet, a dead debtor's debt is paid, and the window bounds the announcements."""
    url = real_redis_or_skip()
    run_state_machine_as_test(
        lambda: AnnouncementLife(url),
        settings=settings(
            max_examples=examples(10), stateful_step_count=15, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
