"""SIGTERM means for every collector what the life cycle says: a scheduler's cancel or an operator's
``kill`` stops the process's syncers - their last reports, then their leases given up as
``terminated``, which observers show as ``aborted`` - and then does what it did before: the
trainer's own handler, or the default death by the signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import redisync
from redisync.inspection import shard_leases

from ..support import wait_for

ROOT = Path(__file__).resolve().parents[2]

LOOP = """
import sys, time
from pathlib import Path
import numpy as np
import redisync
from redisync.collector.workers import new_syncer
from tests.collector.test_sidecar import Cumulative
{handler}
store = redisync.connect({url!r}, run={run!r})
term = Cumulative()
syncer = new_syncer(store, 0, [term], worker={worker!r}).start()
Path({ready!r}).write_text("")
while True:  # the collector loop: a step, the sync's two calls
    term.step()
    syncer.on_step()
    syncer.at_reset_boundary()
    time.sleep(0.01)
"""

OWN_HANDLER = """
import signal
def own(signum, frame):  # the trainer's own: it saves and exits 0
    Path({marker!r}).write_text("own handler ran")
    sys.exit(0)
signal.signal(signal.SIGTERM, own)
"""


def _collector(real_url, tmp_path, worker: str, own_handler: bool):
    run, ready, marker = f"sigterm-{uuid.uuid4().hex[:8]}", tmp_path / "ready", tmp_path / "own"
    handler = OWN_HANDLER.format(marker=str(marker)) if own_handler else ""
    code = textwrap.dedent(LOOP).format(handler=handler, url=real_url, run=run, worker=worker, ready=str(ready))
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    return process, redisync.connect(real_url, run=run), ready, marker


@pytest.mark.integration  # a collector process (and its sidecar)
@pytest.mark.parametrize("worker", ["thread", "process"])
@pytest.mark.parametrize("own_handler", [False, True], ids=["default", "trainer's handler"])
def test_a_collector_sent_sigterm_stops_as_aborted_and_then_as_it_would_have(real_url, tmp_path, worker, own_handler):
    """The README's loop, sent SIGTERM: the shard's lease reads ``aborted`` (it read ``lapsed``: the
    lease was never given up), its last report is in the store, and the process then ends as it
    would have without redisync - killed by the signal, or by its own handler's exit."""
    process, store, ready, marker = _collector(real_url, tmp_path, worker, own_handler)
    try:
        assert wait_for(ready.exists, timeout=60)
        assert wait_for(lambda: shard_leases(store) == {0: "live"}, timeout=30)
        os.kill(process.pid, signal.SIGTERM)
        code = process.wait(30)
        assert shard_leases(store) == {0: "aborted"}
        assert float(store.fleet().keys["t/stats"].parts()["count"]) >= 1
        if own_handler:
            assert code == 0
            assert marker.read_text() == "own handler ran"
        else:
            assert code == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        store.delete()
