"""deploy/redis.conf starts a real server, keeps run keys from eviction and brings state back after a restart."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import redisync
from redisync import redis_server
from redisync.lifeline import popen
from redisync.redis_server import free_port
from redisync.store.schema import Schema, merge

from .servers import RedisProcess

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

CONF = Path(__file__).resolve().parents[1] / "deploy" / "redis.conf"


def test_redis_conf_runs_a_durable_non_evicting_store(tmp_path):
    """deploy/redis.conf runs a store with an fsynced append-only file that never evicts a run's keys."""
    server = RedisProcess(tmp_path, conf=CONF).start()
    port = server.port
    try:
        cfg = redis.Redis(port=port).config_get("*")
        assert cfg["appendonly"] == "yes"
        assert cfg["appendfsync"] == "everysec"
        assert cfg["maxmemory-policy"] == "noeviction"
        store = redisync.connect(f"redis://127.0.0.1:{port}/0", run="conf")
        store.register(Schema.of({"obs/norm": merge(2, lifecycle="history")}))
        shard = store.shard(0)
        shard.publish({"obs/norm": {"count": 3, "sum": [1.0, 2.0]}})
        before = store.fleet()
    finally:
        server.stop()  # a clean shutdown writes the AOF out
    server.start()
    try:
        after = redisync.connect(f"redis://127.0.0.1:{port}/0", run="conf")
        after.register(Schema.of({"obs/norm": merge(2, lifecycle="history")}))
        state = after.fleet()
        assert state.epoch == before.epoch
        assert state.fleet_version == before.fleet_version
        np.testing.assert_array_equal(state.keys["obs/norm"].value, before.keys["obs/norm"].value)
    finally:
        server.kill()


def test_compose_file_is_valid(tmp_path):
    """`docker compose config` where the compose plugin exists, otherwise a structural check."""
    import yaml

    compose = CONF.parent / "docker-compose.yml"
    if shutil.which("docker") and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        result = subprocess.run(
            ["docker", "compose", "-f", str(compose), "--profile", "sentinel", "config", "-q"],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
    doc = yaml.safe_load(compose.read_text())
    services = doc["services"]
    assert {"redis", "redis-primary", "redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"} <= set(services)
    monitoring = {"redis-exporter", "prometheus", "grafana"}
    assert monitoring <= set(services)
    for name, svc in services.items():
        assert isinstance(svc["image"], str), name
        if name in monitoring:
            assert svc.get("profiles") == ["monitoring"], name
            assert ":" in svc["image"], name  # a pinned release
            assert not svc["image"].endswith(":latest"), name
        else:
            assert svc["image"].startswith("redis:7"), name
            assert isinstance(svc["command"], list), name
            assert svc["command"], name
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):  # a bind mount of one of deploy/'s own files or folders
                assert (compose.parent / source).exists(), f"{name} mounts a missing {source}"
            else:
                assert source in doc["volumes"], f"{name} uses an undeclared volume {source}"
        if name != "redis" and name not in monitoring:
            assert svc.get("profiles") == ["sentinel"], name
    exporter = services["redis-exporter"]["environment"]
    acl = (CONF.parent / "users.acl").read_text()
    assert f"user {exporter['REDIS_USER']} on >{exporter['REDIS_PASSWORD']} " in acl
    ports = [p.split(":")[0] for svc in services.values() for p in svc.get("ports", [])]
    assert len(ports) == len(set(ports)), "two services publish the same host port"
    assert "--replicaof" in services["redis-replica"]["command"]
    assert "--min-replicas-to-write" in services["redis-primary"]["command"]


def test_sentinel_conf_monitors_a_primary(tmp_path):
    """deploy/sentinel.conf, pointed at a local primary, runs a sentinel that reports it."""
    primary = RedisProcess(tmp_path / "primary")
    primary.workdir.mkdir()
    primary.start()
    sentinel_port = free_port()
    conf = (CONF.parent / "sentinel.conf").read_text()
    conf = conf.replace("redis-primary 6379", f"127.0.0.1 {primary.port}").replace(
        "port 26379", f"port {sentinel_port}"
    )
    conf = conf.replace("dir /data", f"dir {tmp_path}")
    (tmp_path / "sentinel.conf").write_text(conf)
    proc = popen(
        redis_server.sentinel_command(tmp_path / "sentinel.conf"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        client = redis.Redis(port=sentinel_port, retry=Retry(NoBackoff(), 0), decode_responses=True)
        for _ in range(100):
            try:
                addr = client.execute_command("SENTINEL", "get-master-addr-by-name", "redisync")
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        assert addr == ["127.0.0.1", str(primary.port)]
    finally:
        proc.kill()
        proc.wait(timeout=10)
        primary.kill()


def _guide_deploy_lines() -> list[str]:
    """The deploy guide's commands (its first bash block under 'Deploying Redis'), comments cut."""
    text = (CONF.parents[1] / "docs" / "guides" / "deploying.md").read_text()
    block = text[text.index("## Deploying Redis") :].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_deploy_guides_steps_run_and_every_role_does_its_part(tmp_path):
    """The deploy guide's `mkdir` and `redis-server` lines, run by bash from the repository root, with only
    the data directory moved into the test's own (and the port where 6390 is taken); then the learner loads redisync's functions and registers the run, a
    collector publishes and pulls, the inspector reads."""
    import socket

    mkdir, server_line = _guide_deploy_lines()[:2]
    assert mkdir == "mkdir -p /var/lib/redisync"
    assert "--dir /var/lib/redisync" in server_line  # a directory of its own, not the working one
    data = tmp_path / "var-lib-redisync"
    root = CONF.parents[1]
    subprocess.run(["bash", "-c", mkdir.replace("/var/lib/redisync", str(data))], cwd=root, check=True)
    with socket.socket() as s:
        port = 6390 if s.connect_ex(("127.0.0.1", 6390)) != 0 else free_port()
    line = server_line.replace("/var/lib/redisync", str(data)) + ("" if port == 6390 else f" --port {port}")
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {line} --daemonize no"], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        url = "redis://{0}:{0}-change-me@127.0.0.1:" + f"{port}/0"
        client = redis.Redis.from_url(url.format("inspector"), retry=Retry(NoBackoff(), 0))
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        learner = redisync.connect(url.format("learner"), run="humanoid-v3")
        learner.load_functions()
        learner.register(Schema.of({"obs/norm": merge(2, lifecycle="history")}))
        collector = redisync.connect(url.format("collector"), run="humanoid-v3").shard(0)
        collector.publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}})
        assert collector.pull() is not None
        inspector = redisync.connect(url.format("inspector"), run="humanoid-v3")
        assert float(inspector.fleet().keys["obs/norm"].parts()["count"]) == 2.0
        assert (data / "appendonlydir").is_dir()  # its files went to its own directory
        assert not (CONF.parents[1] / "appendonlydir").exists()
    finally:
        proc.kill()
        proc.wait()


def test_redis_cluster_conf_runs_a_cluster_node_that_keeps_other_slots_serving(tmp_path, monkeypatch):
    """deploy/redis-cluster.conf (redis.conf's settings included), started from the clone's root as its
    header says, runs a cluster node that keeps serving the slots it has while others have no primary,
    and refuses reads of a slot that is down."""
    monkeypatch.chdir(CONF.parents[1])
    server = RedisProcess(tmp_path, free_port(), conf=CONF.parent / "redis-cluster.conf").start()
    try:
        cfg = redis.Redis(port=server.port).config_get("*")
        assert cfg["cluster-enabled"] == "yes"
        assert cfg["cluster-require-full-coverage"] == "no"
        assert cfg["cluster-allow-reads-when-down"] == "no"
        assert cfg["appendonly"] == "yes"  # redis.conf's durability, included
        assert cfg["maxmemory-policy"] == "noeviction"
    finally:
        server.kill()
