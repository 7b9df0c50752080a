"""The thread worker (`redisync.collector.thread_worker`): its steps, what it says and counts, its wake-up."""

from __future__ import annotations

import threading

import redisync
from redisync import errors
from redisync.collector.thread_worker import Wake
from redisync.collector.workers import new_syncer

from .test_syncer import Collector


def test_a_refusal_is_counted_only_once_health_says_its_reason(real_url):
    """A reader that saw the rejected count move read the previous refusal's reason from health()
    (the count moved before the reason): the worker parity test saw two workers disagree on a busy
    machine. The count moves only once the new reason is said."""
    collector = Collector(0)
    syncer = new_syncer(redisync.connect(real_url, run="refusal-order"), 0, collector.terms, worker="thread")
    worker = syncer.worker
    seen = []

    class Stats(dict):
        def __setitem__(self, name, value):
            super().__setitem__(name, value)
            if name == "rejected":
                seen.append(worker.problems.current)

    worker.stats = Stats(worker.stats)
    reasons = iter(["first refusal", "second refusal"])

    def refused(reports):
        raise errors.MalformedReport("obs/n", next(reasons))

    worker.shard.publish = refused
    for _ in range(2):
        worker._hand_over({"obs/n": {"count": 1.0}})
        worker._attempt("publish", worker._publish_pending)
    assert len(seen) == 2
    assert "first refusal" in (seen[0] or "")  # (None: counted before it was said)
    assert "second refusal" in (seen[1] or "")


def test_a_step_with_nothing_to_send_does_not_end_an_outage(real_url, caplog):
    """The worker said "the store answers again" after 0.0 s, twice per outage, when the step after a
    failed one had nothing to publish (no network call at all): only a step that reached the store
    ends an outage."""
    collector = Collector(0)
    syncer = new_syncer(redisync.connect(real_url, run="outage-steps"), 0, collector.terms, worker="thread")
    worker = syncer.worker

    def unreachable():
        raise errors.ConnectionUnavailable("redis://nowhere: refused")

    with caplog.at_level("INFO", logger="redisync"):
        worker._attempt("lease", unreachable)
        assert worker._attempt("publish", worker._publish_pending) is False  # nothing handed: no network
        back = [r for r in caplog.records if "the store answers again" in r.getMessage()]
        assert back == []
        worker._attempt("lease", lambda: None)  # a step that reached the store
        back = [r for r in caplog.records if "the store answers again" in r.getMessage()]
        assert len(back) == 1


def test_the_wake_up_is_kept_until_taken_and_cleared_by_clear():
    """A wake-up set before the worker waits is not lost; `clear` forgets the ones not taken; `wait`
    says whether one came (a signal handler may set it at any moment: it never blocks)."""
    wake = Wake()
    wake.set()
    assert wake.wait(timeout=0)
    assert not wake.wait(timeout=0)
    wake.set()
    wake.set()
    wake.clear()
    assert not wake.wait(timeout=0)
    later = threading.Timer(0.05, wake.set)
    later.start()
    assert wake.wait(timeout=30)
    later.join()
