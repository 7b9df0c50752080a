"""Following a run's versions channel (`redisync.store.subscription`): confirmed, then every fold heard."""

from __future__ import annotations

import time

import numpy as np
import redis

from redisync.store.schema import Schema, merge
from redisync.store.subscription import ANNOUNCED, SUBSCRIBED, Subscription

SCHEMA = Schema.of({"obs/n": merge(1, lifecycle="history")})


def _heard(sub: Subscription, want: str, within_s: float = 30.0):
    """What ``sub`` hears of kind ``want`` first (None if nothing by ``within_s``: a deadline that only
    ends a test that would hang, generous for a loaded machine)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = sub.next()
        if got is not None and got[0] == want:
            return got
    return None


def test_a_subscription_says_it_is_confirmed_then_hears_each_fold(make_store):
    """``subscribed`` once both channels confirmed (nothing is missed from then on), then each fold's
    ``<fleet_version> <epoch>`` once (the shard channel and the plain one are not both announced)."""
    store = make_store()
    store.register(SCHEMA)
    sub = Subscription(store, shard_channel=True, keepalive_s=10.0)
    try:
        sub.open()
        assert _heard(sub, SUBSCRIBED) == (SUBSCRIBED, None)
        result = store.shard(0).publish({"obs/n": {"count": 1.0, "sum": np.ones(1)}})
        what, message = _heard(sub, ANNOUNCED)
        version, _, epoch = message.partition(" ")
        assert (what, int(version)) == (ANNOUNCED, result.fleet_version)
        assert epoch == store.run_info()["epoch"]
        assert _heard(sub, ANNOUNCED, within_s=0.5) is None  # one announcement per fold
    finally:
        sub.close()


def test_a_quiet_subscription_is_pinged_and_one_that_does_not_answer_is_dropped(make_store, monkeypatch):
    """A connection that carries nothing for ``keepalive_s`` gets a PING; no answer within another
    ``keepalive_s`` raises ``ConnectionError`` (the listener replaces it)."""
    store = make_store()
    sub = Subscription(store, shard_channel=False, keepalive_s=0.3)
    try:
        sub.open()
        assert _heard(sub, SUBSCRIBED) is not None
        pings = []
        monkeypatch.setattr(sub._pubsub, "ping", lambda: pings.append(1))  # sent, never answered
        raised = None
        deadline = time.monotonic() + 60  # (only ends a test that would hang: the outcome decides)
        while raised is None and time.monotonic() < deadline:
            try:
                sub.next()
            except ConnectionError as e:
                raised = e
        assert pings == [1]
        assert "answered no PING within 0.3 s" in str(raised)
    finally:
        sub.close()


def test_the_shard_channel_refused_by_an_acl_is_told_from_other_failures():
    """A role without SSUBSCRIBE is refused the shard channel (the listener then follows the plain one);
    other failures are not that."""
    refused = redis.exceptions.NoPermissionError("User c has no permissions to run the 'ssubscribe' command")
    assert Subscription.shard_channel_refused(refused)
    assert not Subscription.shard_channel_refused(redis.exceptions.NoPermissionError("no permissions to run 'get'"))
    assert not Subscription.shard_channel_refused(ConnectionError("ssubscribe: connection reset"))
