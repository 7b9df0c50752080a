"""deploy/redis.conf starts a real server, keeps run keys from eviction and brings state back after a restart."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis

import redisync
from redisync.schema import Schema, merge

from .servers import free_port

CONF = Path(__file__).resolve().parents[1] / "deploy" / "redis.conf"


def start_server(workdir: Path, port: int) -> subprocess.Popen:
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is not installed (scripts/ensure-redis installs it)")
    proc = subprocess.Popen(
        ["redis-server", str(CONF), "--port", str(port), "--dir", str(workdir), "--daemonize", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail(f"redis-server with {CONF} did not start")


def stop_server(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # a clean shutdown writes the AOF out
    proc.wait(timeout=10)


def test_redis_conf_runs_a_durable_non_evicting_store(tmp_path):
    port = free_port()
    proc = start_server(tmp_path, port)
    try:
        cfg = redis.Redis(port=port).config_get("*")
        assert cfg["appendonly"] == "yes" and cfg["appendfsync"] == "everysec"
        assert cfg["maxmemory-policy"] == "noeviction"
        store = redisync.connect(f"redis://127.0.0.1:{port}/0", run="conf")
        store.register(Schema.of({"obs/norm": merge(2)}))
        shard = store.shard(0)
        shard.publish({"obs/norm": {"count": 3, "sum": [1.0, 2.0]}})
        before = store.fleet()
    finally:
        stop_server(proc)
    proc = start_server(tmp_path, port)
    try:
        after = redisync.connect(f"redis://127.0.0.1:{port}/0", run="conf")
        after.register(Schema.of({"obs/norm": merge(2)}))
        state = after.fleet()
        assert state.epoch == before.epoch and state.fleet_version == before.fleet_version
        np.testing.assert_array_equal(state.keys["obs/norm"].value, before.keys["obs/norm"].value)
    finally:
        stop_server(proc)
