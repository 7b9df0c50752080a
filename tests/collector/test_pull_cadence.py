"""When a collector's worker reads the fleet state: never while its subscription to the run's
versions channel is live and quiet, one plain read of the version per poll while it is down, and
one call of the pull function once a new version or epoch is announced (a fold, a restore, a run
registered again). Decided by the server's command counts, never by timing."""

from __future__ import annotations

import contextlib
import time
import uuid

import pytest
import redis

import redisync
from redisync.collector.workers import new_syncer

from ..faults import SilencingProxy
from ..support import wait_for
from .test_sidecar import KEY, Cumulative
from .test_sidecar_faults import Versions

READS = ("fcall_ro", "evalsha_ro", "evalsha", "hmget")  # every way a pull reached the server, then and now


def _reads(store) -> dict[str, int]:
    stats = store.redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in READS}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in READS}


def _synced(syncer, term) -> None:
    term.step()
    syncer.on_step()
    syncer.flush()
    assert syncer.wait_synced(timeout=20)
    assert wait_for(lambda: syncer.metrics()["redisync/subscribed"] == 1.0, timeout=20)
    # the pull owed once the subscription is confirmed (what changed before it was not announced)
    settled, last = time.monotonic() + 5, _reads(syncer.store)
    while time.monotonic() < settled:
        time.sleep(0.3)
        now = _reads(syncer.store)
        if now == last:
            break
        last = now


@contextlib.contextmanager
def _collector(url: str, term, worker: str, poll_every_s: float):
    """A run of its own and shard 0's Syncer on it (reports only when flushed); both gone afterwards."""
    store = redisync.connect(url, run=f"cadence-{uuid.uuid4().hex[:8]}")
    syncer = new_syncer(store, 0, [term], worker=worker, poll_every_s=poll_every_s, publish_every_steps=10**9)
    try:
        yield store, syncer.start()
    finally:
        syncer.stop(flush=False)
        store.delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_subscribed_collector_reads_nothing_while_the_run_is_quiet(counted_url, worker):
    """A collector following the run's channel reads nothing from the server while the run is quiet."""
    term = Cumulative()
    with _collector(counted_url, term, worker, poll_every_s=0.05) as (store, syncer):
        _synced(syncer, term)
        before = _reads(store)
        time.sleep(1.0)  # twenty poll intervals
        assert _delta(before, _reads(store)) == dict.fromkeys(READS, 0)
        # and an announced fold is still followed: another shard publishes, this one applies it
        other = store.shard(5)
        other.publish({KEY: {"count": 4.0, "sum": [1.0] * 8}})
        assert wait_for(lambda: (syncer.at_reset_boundary(), term.fleet)[1] is not None and term.fleet["count"] == 5.0)


def test_without_a_subscription_a_poll_is_one_plain_read_of_the_version(counted_url, monkeypatch):
    """Without a subscription, a poll that finds nothing new is one plain read of the run's version."""
    monkeypatch.setattr("redisync.collector.thread_worker.ThreadWorker._listen", lambda self: None)  # never subscribed
    term = Cumulative()
    with _collector(counted_url, term, "thread", poll_every_s=0.05) as (store, syncer):
        term.step()
        syncer.on_step()
        syncer.flush()
        assert syncer.wait_synced(timeout=20)
        before = _reads(store)
        assert wait_for(lambda: _delta(before, _reads(store))["hmget"] >= 5, timeout=20)  # the polls went on
        delta = _delta(before, _reads(store))
        assert delta["fcall_ro"] == delta["evalsha_ro"] == delta["evalsha"] == 0  # none called the pull function


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_a_restore_is_announced_to_a_collector_that_never_polls(real_url, worker):
    """A restore is announced: a collector that never polls applies the restored state's new epoch."""
    seen = Versions()
    with _collector(real_url, seen, worker, poll_every_s=3600) as (store, syncer):
        _synced(syncer, seen)
        snap = store.snapshot()
        store.restore(snap)  # a new epoch, announced on the channel
        epoch = store.fleet().epoch

        def applied_restored() -> bool:
            syncer.at_reset_boundary()
            return bool(seen.applied) and seen.applied[-1][0] == epoch

        assert wait_for(applied_restored, timeout=20)


def test_a_version_announced_while_the_first_pull_is_on_its_way_is_pulled(real_url):
    """The first pull's epoch is new to the shard, not to the listener: another shard's fold heard
    on the channel while that pull's answer was on its way must still be pulled, with the
    subscription live and no poll to cover for it (it was lost once: a collector that does not
    publish waited for the run's next fold)."""
    term, folded = Cumulative(), []
    store = redisync.connect(real_url, run=f"cadence-{uuid.uuid4().hex[:8]}")
    syncer = new_syncer(store, 0, [term], worker="thread", poll_every_s=3600, publish_every_steps=10**9)
    real_pull, other = syncer.shard.pull, store.shard(5)

    def pull(check_first: bool = True):
        if not folded:  # the first pull: once the subscription is live, so the fold is announced to us
            assert wait_for(lambda: syncer.worker._subscribed, timeout=20)
        result = real_pull(check_first=check_first)
        if not folded:
            assert result is not None
            assert result.epoch_changed
            assert result.fleet_version == 0
            other.publish({KEY: {"count": 4.0, "sum": [1.0] * 8}})  # version 1, announced
            folded.append(
                wait_for(lambda: syncer.worker._announced == 1, timeout=20)
            )  # heard before the pull is applied
        return result

    syncer.shard.pull = pull
    try:
        syncer.start()
        assert wait_for(lambda: bool(folded), timeout=30)
        assert folded == [True]
        assert syncer.wait_synced(at_least=1, timeout=20)  # (the old worker set what it heard back to 0: False)
        assert syncer.at_reset_boundary()
        assert term.fleet["count"] == 4.0
    finally:
        syncer.stop(flush=False)
        store.delete()


def test_a_subscription_gone_silent_is_replaced_and_the_fold_it_missed_is_pulled(real_url):
    """A subscription whose connection carries nothing any more and closes nothing (a firewall or NAT
    that forgot it) is PINGed, found dead and replaced; the pull owed after the new subscription
    brings the fold it missed. Without the PING the listener waited for ever, subscribed in name,
    and the worker never polled (a poll is for a subscription that is down)."""
    kwargs = redis.Redis.from_url(real_url).connection_pool.connection_kwargs
    proxy = SilencingProxy(kwargs["port"], b"SUBSCRIBE")
    url = f"redis://127.0.0.1:{proxy.port}/{kwargs.get('db', 0)}"
    term = Cumulative()
    store = redisync.connect(real_url, run=f"cadence-{uuid.uuid4().hex[:8]}")
    syncer = new_syncer(redisync.connect(url, run=store.run), 0, [term], worker="thread", poll_every_s=0.05)
    syncer.worker.keepalive_s = 0.5
    try:
        syncer.start()
        assert wait_for(lambda: syncer.metrics()["redisync/subscribed"] == 1.0, timeout=20)
        assert syncer.wait_synced(timeout=20)
        proxy.silence()  # the subscription's connection now loses everything, both ways
        store.shard(5).publish({KEY: {"count": 4.0, "sum": [1.0] * 8}})  # announced on a connection that is gone
        assert syncer.wait_synced(at_least=1, timeout=20)
        # (on a loaded machine the fold may arrive by another path before the PING finds the subscription dead)
        assert wait_for(lambda: syncer.stats["subscription_drops"] >= 1, timeout=20)
        assert syncer.at_reset_boundary()
        assert term.fleet["count"] == 4.0
        assert wait_for(lambda: syncer.metrics()["redisync/subscribed"] == 1.0, timeout=20)  # a new one
    finally:
        syncer.stop(flush=False)
        proxy.close()
        store.delete()


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_forged_and_garbled_announcements_cost_at_most_a_pull_each_and_are_forgotten(counted_url, worker):
    """Anyone who may publish on the run's channel (collectors and learners may) can send a version a
    million ahead, another epoch's, or garbage: announcements are hints, so each costs at most one
    pull, is then forgotten, and wait_synced() and staleness go by the store again (a forged version
    made every collector pull again and again, wait_synced() never return and staleness read 1e6; a
    garbled one dropped the subscription)."""
    term = Cumulative()
    with _collector(counted_url, term, worker, poll_every_s=3600) as (store, syncer):
        _synced(syncer, term)
        epoch = store.run_info()["epoch"]
        drops = syncer.metrics()["redisync/subscription_drops"]
        before = _reads(store)
        forged = [f"1000000 {epoch}", "7 an-epoch-of-nobody", "garbage", "", "12", "x y"]
        for message in forged:
            store.redis.publish(store.keys.channel, message)
        time.sleep(3)  # quiet: nothing real happens
        spent = _delta(before, _reads(store))
        # the two well-formed lies: a call of the pull function each, at most, and one owed from before the
        # window on a loaded machine (its HMGETs count as reads too); a lie that stuck pulled again and again
        assert spent["fcall_ro"] + spent["evalsha_ro"] + spent["evalsha"] <= 3, spent
        assert syncer.wait_synced(timeout=10)
        syncer.at_reset_boundary()  # the collector applies what its worker holds: the store's state
        metrics = syncer.metrics()
        assert metrics["redisync/staleness_versions"] == 0.0
        assert metrics["redisync/subscribed"] == 1.0
        assert metrics["redisync/subscription_drops"] == drops
        # a real fold is still heard and pulled
        version = store.fleet().fleet_version
        store.shard(9).publish({KEY: {"count": 1, "sum": [1.0] * term.n}})
        assert syncer.wait_synced(at_least=version + 1, timeout=20)
