"""The one rule for when a report is due, for the Syncer's hot path and the sidecar's shared buffers."""

from __future__ import annotations

import numpy as np

from redisync.collector.cadence import Cadence
from redisync.collector.mailbox import FLUSH, STEPS
from redisync.collector.sidecar_process import SharedCadence


def test_a_report_falls_due_after_its_steps_or_its_seconds_whichever_first():
    """Due after ``every_steps`` steps or ``every_s`` seconds since the last report taken, whichever first."""
    c = Cadence(3, 10.0, taken_at=100.0)
    assert not c.due(2, 105.0)
    assert c.due(3, 105.0)  # the steps
    assert c.due(0, 110.0)  # the seconds
    c.taken(3, 110.0)
    assert not c.due(5, 119.9)
    assert c.due(6, 111.0)


def test_the_hot_path_counts_its_own_steps_and_a_taken_report_starts_the_count_again():
    """`step` counts the hot path's steps; a report stays due until it is taken, then the count starts again."""
    c = Cadence(2, 3600.0)
    assert [c.step(), c.step()] == [False, True]
    assert c.step()  # not taken yet: still due
    c.taken()
    assert [c.step(), c.step()] == [False, True]


class _Reader:
    def __init__(self):
        self.seq, self.reports = 0, {"k": {"count": 1.0}}

    def snapshot(self):
        return self.seq, self.reports


def test_the_sidecar_reads_the_shared_buffers_by_the_collectors_steps_and_at_once_for_a_flush():
    """The sidecar reads the shared buffers when the collector's steps (in the header) make a report
    due and the worker is free, at once for a flush request, and never publishes one copy twice."""
    header = np.zeros(32, dtype=np.int64)
    now = 5000.0  # (a monotonic clock: a sidecar's first read is due by the clock, taken at 0.0)
    shared = SharedCadence(_Reader(), header, Cadence(4, 3600.0, taken_at=0.0))
    assert not shared.due(now, busy=False)  # the collector has not stepped: nothing new to read
    header[STEPS] = 1
    assert shared.due(now, busy=False)
    assert not shared.due(now, busy=True)  # the worker is busy: the next report would only replace it
    assert shared.take(now) == {"k": {"count": 1.0}}
    header[STEPS] = 4
    assert not shared.due(now + 1, busy=False)
    header[STEPS] = 5
    assert shared.due(now + 1, busy=False)  # four steps since the last read
    assert shared.take(now + 1) is None  # the same copy (seq) is not published twice
    header[FLUSH] = 1
    assert shared.due(now + 1, busy=True)  # a flush request, busy or not
    shared.take(now + 1)
    assert shared.covered == 1
