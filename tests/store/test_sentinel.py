"""Sentinel failover during a publish loop: clients follow the new primary, nothing acknowledged is lost."""

from __future__ import annotations

import itertools
import subprocess
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import redisync
from redisync import errors, redis_server
from redisync.lifeline import popen
from redisync.redis_server import free_port
from redisync.store.schema import Schema, merge

from ..servers import RedisProcess

pytestmark = pytest.mark.integration  # starts redis-server processes of its own (see tests/servers.py)

SERVICE = "redisync"


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (redis.RedisError, errors.ConnectionUnavailable):
            pass
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def plain(port: int) -> redis.Redis:
    return redis.Redis(port=port, retry=Retry(NoBackoff(), 0), socket_timeout=1, decode_responses=True)


@pytest.fixture
def sentinel_fleet(tmp_path):
    """A primary (min-replicas-to-write 1), a replica and three sentinels, all on loopback."""
    (tmp_path / "p").mkdir()
    (tmp_path / "r").mkdir()
    primary = RedisProcess(tmp_path / "p", None, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10").start()
    replica = RedisProcess(tmp_path / "r").start()
    plain(replica.port).replicaof("127.0.0.1", primary.port)
    wait_for(
        lambda: plain(primary.port).info("replication").get("slave0", {}).get("state") == "online",
        15,
        "the replica to sync",
    )
    wait_for(lambda: plain(primary.port).set("probe", 1), 15, "writes to be accepted (min-replicas-to-write)")
    sentinels = []
    for i in range(3):
        port = free_port()
        conf = tmp_path / f"sentinel-{i}.conf"
        conf.write_text(
            f"port {port}\ndir {tmp_path}\nsentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 3000\nsentinel failover-timeout {SERVICE} 10000\n"
        )
        sentinels.append(
            (
                port,
                popen(redis_server.sentinel_command(conf), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
            )
        )
    for port, _ in sentinels:
        wait_for(
            lambda port=port: (
                int(plain(port).info("sentinel")["sentinel_masters"]) == 1
                and plain(port).execute_command("SENTINEL", "replicas", SERVICE)
            ),
            15,
            "the sentinels",
        )
    url = f"redis+sentinel://{','.join(f'127.0.0.1:{p}' for p, _ in sentinels)}/{SERVICE}/0"
    yield url, primary, replica, [p for p, _ in sentinels]
    for _, proc in sentinels:
        proc.kill()
        proc.wait(timeout=10)
    primary.kill()
    replica.kill()


def test_failover_loses_no_acknowledged_report(sentinel_fleet):
    """A Sentinel failover loses no report acknowledged with wait_replicas."""
    url, primary, replica, sentinel_ports = sentinel_fleet
    store = redisync.connect(url, run="failover", wait_replicas=1, wait_timeout_ms=500, socket_timeout=1.0)
    wait_for(lambda: store.register(Schema.of({"obs/norm": merge(1, lifecycle="history")})), 15, "the run to register")
    shard = store.shard(0)
    acknowledged, versions, gaps = 0, [], []

    def promoted() -> bool:
        """Every sentinel names the promoted replica (a client may ask any of them)."""
        try:
            return all(
                int(plain(p).execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)[1]) == replica.port
                for p in sentinel_ports
            )
        except redis.RedisError:
            return False

    last_ok = time.monotonic()
    killed = restarted = False
    count = 0
    while acknowledged < 400:
        count += 1  # this shard's cumulative count: a report carries everything so far
        try:
            result = shard.publish({"obs/norm": {"count": count, "sum": float(count)}})
        except errors.ConnectionUnavailable:  # failover under way (or not yet replicated): publish again
            time.sleep(0.05)
            if killed and not restarted and promoted():
                # only once the failover is done: an empty primary back before it would win (and lose the run)
                primary.start()  # the old primary returns; the sentinels make it a replica of the new one
                restarted = True
            continue
        now = time.monotonic()
        gaps.append(now - last_ok)
        last_ok = now
        acknowledged = count
        versions.append(result.fleet_version)
        if count == 150 and not killed:
            primary.kill()  # SIGKILL the primary in the middle of the loop
            killed = True
    new_primary = plain(sentinel_ports[0]).execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
    assert int(new_primary[1]) == replica.port  # the replica was promoted and the client followed it
    fleet = None
    for _ in range(50):
        try:
            fleet = store.fleet().keys["obs/norm"].parts()
            break
        except errors.ConnectionUnavailable:
            time.sleep(0.1)
    assert float(fleet["count"]) == acknowledged  # every acknowledged report is there
    assert all(b > a for a, b in itertools.pairwise(versions))  # no version went backwards
    print(f"\nfailover: the longest pause between acknowledged publishes was {max(gaps):.2f}s")
