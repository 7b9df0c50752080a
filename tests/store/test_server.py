"""The server under a store, for measuring it (`redisync.store.server`): its CPU seconds, each key's
memory, the slow log (on a server of the test's own: it changes the server's settings, then puts
them back), a subscriber, and a server without a run."""

from __future__ import annotations

import numpy as np

from redisync.store.client import connect
from redisync.store.connection import server_at
from redisync.store.schema import Schema, merge


def _run(url: str):
    store = connect(url, run="server-probe")
    store.register(Schema.of({"probe/m": merge(4, lifecycle="history")}))
    return store


def test_its_figures_are_the_servers_own(counted_url):
    """CPU seconds grow with work; each of the run's keys has its memory; a raw client and a server
    found by URL answer."""
    store = _run(counted_url)
    try:
        server = store.server()
        before = server.cpu_s()
        shard = store.shard(0)
        for k in range(300):
            shard.publish({"probe/m": {"count": 1.0, "sum": np.full(4, float(k))}})
        assert server.cpu_s() > before >= 0
        memory = server.memory_by_key(store.keys.pattern)
        assert store.keys.meta in memory
        assert store.keys.key_data("probe/m") in memory
        assert all(used > 0 for used in memory.values())
        assert all(key.startswith("redisync:{server-probe}") for key in memory)
        server_at(counted_url).ping()
        assert server.client.exists(store.keys.meta) == 1
    finally:
        store.delete()


def test_the_slow_log_times_each_fold_and_puts_the_settings_back(counted_url):
    """While on, every FCALL is logged and its median time read; closed, the server's slow-log
    settings are what they were."""
    store = _run(counted_url)
    server = store.server()
    settings = server.client.config_get("slowlog-*")
    log = server.slow_log(50)
    try:
        assert server.client.config_get("slowlog-log-slower-than")["slowlog-log-slower-than"] == "0"
        log.reset()
        shard = store.shard(0)
        for k in range(20):
            shard.publish({"probe/m": {"count": 1.0, "sum": np.full(4, float(k))}})
        assert log.median_us("FCALL") is not None
        assert log.median_us("NO-SUCH-COMMAND") is None
    finally:
        log.close()
        store.delete()
    assert server.client.config_get("slowlog-*") == settings


def test_a_subscriber_hears_the_runs_announcements(counted_url):
    """A subscriber on the run's channel is confirmed, then hears a fold's announcement."""
    store = _run(counted_url)
    listener = store.server().subscriber(store.keys.channel)
    try:
        confirmation = listener.get_message(timeout=30.0)
        assert confirmation is not None
        assert confirmation["type"] == "ssubscribe"
        store.shard(0).publish({"probe/m": {"count": 1.0, "sum": np.ones(4)}})
        heard = None
        for _ in range(60):  # (an end for a hung test only: the message decides)
            heard = listener.get_message(timeout=0.5)
            if heard is not None:
                break
        assert heard is not None
        assert heard["type"] == "smessage"
    finally:
        listener.close()
        store.delete()
