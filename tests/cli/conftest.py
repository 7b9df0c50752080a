"""The command line's tests: running a command as a user does, and a populated run on either backend."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

import redisync as redisync_api
from redisync.store import codec
from redisync.store.client import serve_embedded
from redisync.store.schema import Schema, broadcast, merge

from ..conftest import real_redis_or_skip


def ctrl_c_default() -> None:
    """In the child: SIGINT as a terminal delivers it, even when this test runs in a background job
    (which starts with SIGINT ignored, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "redisync.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(params=["embedded", "real"])
def cli_url(request):
    """A store the CLI subprocesses reach: a real Redis, or the embedded server served over TCP."""
    if request.param == "real":
        yield real_redis_or_skip()
        return
    server = serve_embedded()
    yield server.url
    server.close()


@pytest.fixture
def populated(cli_url):
    """A run with three shards, a broadcast decision and one rejected report."""
    store = redisync_api.connect(cli_url, run=f"cli-{uuid.uuid4().hex[:8]}")
    store.register(
        Schema.of(
            {
                "motion/bin_failed": merge(4, stale_after_s=60, lifecycle="state"),
                "curriculum/scale": broadcast((), owner=0),
            }
        )
    )
    for shard in range(3):
        store.shard(shard).publish({"motion/bin_failed": {"count": 1, "sum": np.eye(4)[shard] + 0.1}})
    store.shard(0).publish({"curriculum/scale": {"value": 0.5}})
    with pytest.raises(
        redisync_api.errors.NotOwner
    ):  # a misbehaving client skips the client-side check: the server refuses
        store.shard(2).publish_payloads({"curriculum/scale": codec.encode([np.array([0.9])])}, seq=1)
    yield cli_url, store
    store.delete()
