"""`redisync exporter`: a scrape of a live fleet's store, every metric and label checked against the
store; the inspector role of deploy/users.acl suffices; a store that does not answer says so."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import redisync
from redisync import inspection
from redisync.redis_server import free_port
from redisync.store.schema import Schema, merge

from .conftest import REAL_URL
from .servers import RedisProcess

pytestmark = [pytest.mark.integration, pytest.mark.extras("prometheus_client")]

ROOT = Path(__file__).resolve().parents[1]
RUN = "humanoid-v3"  # the run deploy/users.acl's roles cover
URL = "redis://{0}:{0}-change-me@127.0.0.1:{1}/0"


def _scrape(port: int) -> dict[tuple[str, frozenset], float]:
    from prometheus_client.parser import text_string_to_metric_families

    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
        if s.name.startswith("redisync_")
    }


def _exporter(url: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisync.cli", "exporter", "--url", url, "--port", str(port), "--addr", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"the exporter did not serve: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.1)


def _fleet(url: str):
    """Four shards: 0 live, 1 lapsed (a 1 ms lease the others' calls outlived), 2 stopped (gave its
    lease up), 3 aborted (gave it up as its trainer died); a failure distribution each, a normaliser's
    moments."""
    learner = redisync.connect(url.format("learner"), run=RUN)
    learner.load_functions()
    learner.register(
        Schema.of(
            {
                "motion/bin_failed": merge(8, lifecycle="state", lease_grace_s=None),
                "obs/norm": merge(2, lifecycle="history", sumsq=True),
                "curriculum/rate": merge(1, lifecycle="state", stale_after_s=0.2),
            }
        )
    )
    store = redisync.connect(url.format("collector"), run=RUN)
    rng = np.random.default_rng(0)
    shards = [store.shard(i) for i in range(4)]
    for shard in shards:
        shard.publish(
            {
                "motion/bin_failed": {"count": 1.0, "sum": rng.random(8)},
                "obs/norm": {"count": 4.0, "sum": rng.random(2), "sumsq": 1 + rng.random(2)},
            }
        )
    shards[1].publish({"curriculum/rate": {"count": 1.0, "sum": [0.5]}})  # once: stale 0.2 s later, for good
    store.lease(1, shards[1].incarnation, 1)
    store.lease(2, shards[2].incarnation, 0)
    store.lease(3, shards[3].incarnation, 0, "parent_exited")
    time.sleep(0.3)  # past shard 1's 1 ms lease and curriculum/rate's stale_after_s
    store.lease(0, shards[0].incarnation, 600_000)  # (the run's clock moves past shard 1's lease)
    shards[0].publish({"motion/bin_failed": {"count": 1.0, "sum": rng.random(8)}})
    return redisync.connect(url.format("inspector"), run=RUN), shards[0]


def test_a_scrape_of_a_live_fleet_says_what_the_store_holds(tmp_path):
    """A scrape of a live fleet on a users.acl server says what the store holds, metric by metric and label by
    label."""
    server = RedisProcess(tmp_path, None, "--aclfile", str(ROOT / "deploy" / "users.acl"))
    server.start_authenticated("inspector", "inspector-change-me")
    url = URL.replace("{1}", str(server.port))
    inspector, live = _fleet(url)
    port = free_port()
    proc = _exporter(url.format("inspector"), port)  # the inspector's read-only rights suffice
    try:
        got = _scrape(port)
        stderr = b""

        def value(name: str, **labels: str) -> float:
            return got[(name, frozenset(labels.items()))]

        assert value("redisync_store_up") == 1.0
        assert value("redisync_run_fleet_version", run=RUN) == inspector.fleet().fleet_version
        assert value("redisync_run_dead_letters", run=RUN) == inspector.redis.xlen(inspector.keys.dead_letters)
        assert 0 <= value("redisync_run_updated_age_seconds", run=RUN) < 600
        leases = inspection.shard_leases(inspector)
        assert leases == {0: "live", 1: "lapsed", 2: "stopped", 3: "aborted"}
        for state in inspection.LEASE_STATES:
            assert value("redisync_run_shards", run=RUN, state=state) == 1.0
            for shard, held in leases.items():
                assert value("redisync_shard_lease_state", run=RUN, shard=str(shard), state=state) == (held == state)
        reports = inspection.shard_reports(inspector)
        drifts = inspection.drift(inspector)["motion/bin_failed"]["shards"]
        for shard in (0, 1, 2, 3):
            age = value("redisync_shard_report_age_seconds", run=RUN, shard=str(shard))
            assert reports[shard]["age_s"] - 1 <= age <= reports[shard]["age_s"] + 600
            assert value("redisync_shard_versions_behind", run=RUN, shard=str(shard)) == reports[shard]["behind"]
            tv = value("redisync_shard_unsynced_tv", run=RUN, shard=str(shard), key="motion/bin_failed")
            assert tv == pytest.approx(drifts[shard]["tv"], abs=1e-12)
            assert 0 < tv < 1
        assert ("redisync_shard_unsynced_tv", frozenset({"run": RUN, "shard": "0", "key": "obs/norm"})) not in got
        meta = inspector.key_info("motion/bin_failed")
        assert value("redisync_key_dropped_lapsed_total", run=RUN, key="motion/bin_failed") == float(
            meta.get("dropped_lapsed", 0)
        )
        assert value("redisync_key_dropped_stale_total", run=RUN, key="obs/norm") == 0.0
        assert value("redisync_key_retired_departed_total", run=RUN, key="obs/norm") == float(
            inspector.key_info("obs/norm").get("retired_departed", 0)
        )
        # a slot past its key's stale_after_s (no fold of the key since), and slots of a key without one
        assert value("redisync_slot_stale", run=RUN, shard="1", key="curriculum/rate") == 1.0
        assert {value("redisync_slot_stale", run=RUN, shard=str(s), key="motion/bin_failed") for s in (0, 1, 2)} == {
            0.0
        }
        # what a shard samples needs a fleet state the exporter saw, at or below the one the shard had
        # seen: shard 0 takes the state just scraped, then reports
        assert not any(name == "redisync_shard_sampled_tv" for name, _ in got)
        assert live.pull() is not None
        live.publish({"motion/bin_failed": {"count": 1.0, "sum": np.full(8, 0.5)}})
        got = _scrape(port)
        sampled = {dict(labels)["shard"]: v for (name, labels), v in got.items() if name == "redisync_shard_sampled_tv"}
        assert set(sampled) == {"0"}
        assert 0 <= sampled["0"] < 1
        # every exported name is one the module documents (the dashboard's and alerts' test reads them)
        from redisync.exporter import METRICS

        assert {n.removesuffix("_total") for n, _ in got} <= set(METRICS)
        server.kill()  # the store goes away: the exporter says so, and shows no figure as current
        got = _scrape(port)
        assert got == {("redisync_store_up", frozenset()): 0.0}
    finally:
        proc.terminate()
        try:
            _, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        server.kill()
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert "the store could not be read" in stderr.decode()  # said once, in the exporter's log
    assert "inspector-change-me" not in stderr.decode()


REDIS_EXPORTER = {"redis_commands_processed_total", "redis_memory_used_bytes", "redis_connected_clients"}


def _exported() -> set[str]:
    """The names a scrape shows: counters with their _total suffix (prometheus_client adds it)."""
    from redisync.exporter import METRICS

    counters = {"redisync_key_dropped_lapsed", "redisync_key_dropped_stale", "redisync_key_retired_departed"}
    return {f"{n}_total" if n in counters else n for n in METRICS}


def _names(expr: str) -> set[str]:
    import re

    return set(re.findall(r"\b(redis(?:ync)?_[a-z_]+)\b", expr))


def test_every_panel_of_the_grafana_board_queries_exported_metrics():
    """deploy/grafana/dashboards/redisync.json: each panel has a query, and each query names only
    metrics `redisync exporter` writes (or redis_exporter's, on the panels that say so)."""
    import json

    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "redisync.json").read_text())
    assert board["uid"]
    assert board["panels"]
    used = set()
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = _names(target["expr"])
            assert names, (panel["title"], target["expr"])
            foreign = {n for n in names if not n.startswith("redisync_")}
            assert names - foreign <= _exported(), (panel["title"], names)
            assert foreign <= REDIS_EXPORTER, panel["title"]
            assert not foreign or "redis_exporter" in panel["title"], panel["title"]
            used |= names
    assert _exported() - used == set(), "a metric the board does not show"
    provider = (ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "redisync.yml").read_text()
    assert "/var/lib/grafana/dashboards" in provider  # where the compose file mounts the board


def test_every_alert_rule_names_exported_metrics():
    """deploy/prometheus/alerts.yml: the shard-lapsed, run-stale, dead-letters and collector-behind
    alerts (and the store-unreadable one), each on metrics the exporter writes; and one on Prometheus'
    own ``up`` of the exporter's job, which fires when the exporter cannot be scraped (every other
    alert is silent then); Prometheus loads it."""
    import yaml

    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yml").read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {
        "RedisyncExporterDown",
        "RedisyncStoreUnreadable",
        "RedisyncRunUnreadable",
        "RedisyncShardLapsed",
        "RedisyncShardAborted",
        "RedisyncRunStale",
        "RedisyncDeadLettersGrowing",
        "RedisyncCollectorBehind",
    }
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in config["scrape_configs"]}
    (down,) = [r for r in rules if r["alert"] == "RedisyncExporterDown"]
    assert down["expr"] == 'up{job="redisync"} == 0'
    assert "redisync" in jobs
    for rule in rules:
        if rule is down:
            continue
        assert _names(rule["expr"]), rule["alert"]
        assert _names(rule["expr"]) <= _exported(), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    assert {j["job_name"] for j in config["scrape_configs"]} == {"redis", "redisync"}


def test_the_metrics_role_reads_the_servers_figures_and_no_key(tmp_path):
    """deploy/users.acl's `metrics` user (redis_exporter's): INFO, CONFIG GET and CLIENT SETNAME (which
    redis_exporter sends on every scrape: NOPERM without it), not a run's keys."""
    import redis

    server = RedisProcess(tmp_path, None, "--aclfile", str(ROOT / "deploy" / "users.acl"))
    server.start_authenticated("metrics", "metrics-change-me")
    try:
        client = redis.Redis(port=server.port, username="metrics", password="metrics-change-me")
        assert "redis_version" in client.info()
        assert "maxmemory" in client.config_get("maxmemory")
        assert client.client_setname("redis_exporter")  # what redis_exporter sends on every scrape
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hgetall(f"redisync:{{{RUN}}}:meta")
    finally:
        server.kill()


def test_the_monitoring_guide_lists_every_metric_with_its_help():
    """docs/guides/monitoring.md's table: one row per exported metric, its help text the module's."""
    from redisync.exporter import METRICS

    text = (ROOT / "docs" / "guides" / "monitoring.md").read_text()
    table = text.split("<!-- the metrics table: tests/test_exporter.py checks it against redisync/exporter.py -->")[1]
    rows = [line for line in table.split("\n\n")[0].splitlines() if line.startswith("| `")]
    assert {row.split("`")[1] for row in rows} == _exported()
    for row in rows:
        name = row.split("`")[1].removesuffix("_total")
        assert row.rstrip(" |").endswith(METRICS[name]), row


def test_a_run_registered_again_with_another_schema_is_read_with_its_new_schema(real_url):
    """The exporter keeps a store per run across scrapes; a run lost and registered again (a new epoch)
    may hold other keys, which the next scrape must read, not the old schema's."""
    import uuid

    from redisync.exporter import FleetCollector

    run = f"exporter-again-{uuid.uuid4().hex[:8]}"
    store = redisync.connect(real_url, run=run)

    def keys_seen(collector) -> set[str]:
        families = {f.name: f for f in collector.collect()}
        assert families["redisync_store_up"].samples[0].value == 1.0
        return {s.labels["key"] for s in families["redisync_key_dropped_lapsed"].samples}

    try:
        store.register(Schema.of({"old/key": merge(2, lifecycle="history")}))
        store.shard(0).publish({"old/key": {"count": 1.0, "sum": [1.0, 2.0]}})
        collector = FleetCollector(real_url, (run,))
        assert keys_seen(collector) == {"old/key"}
        store.delete()
        again = redisync.connect(real_url, run=run)
        again.register(Schema.of({"new/key": merge(3, lifecycle="history")}))
        assert keys_seen(collector) == {"new/key"}
    finally:
        redisync.connect(real_url, run=run).delete()


def test_a_run_it_cannot_describe_is_that_runs_error_never_the_stores(real_url):
    """A run whose meta is malformed (a fleet version that is no number, a schema that does not parse)
    or of the wrong type is one redisync_run_error series with the error's type, and nothing else of
    it; the store is up and a healthy run beside them is exported whole. (Before, the scrape failed:
    redisync_store_up 0, or an HTTP 500 with no store_up at all.)"""
    import uuid

    import redis as redis_py

    from redisync.exporter import FleetCollector
    from redisync.store.keys import RunKeys

    tag = uuid.uuid4().hex[:8]
    good, version, schema, wrong = (f"exp-{name}-{tag}" for name in ("good", "version", "schema", "wrongtype"))
    client = redis_py.Redis.from_url(real_url)
    stores = [redisync.connect(real_url, run=r) for r in (good, version, schema)]
    try:
        for store in stores:
            store.register(Schema.of({"obs/norm": merge(2, lifecycle="history")}))
            store.shard(0).publish({"obs/norm": {"count": 1.0, "sum": [1.0, 2.0]}})
        client.hset(RunKeys(version).meta, "fleet_version", "abc")
        client.hset(RunKeys(schema).meta, "schema", "{not json")
        client.set(RunKeys(wrong).meta, "a string where a hash belongs")
        for runs in ((good, version, schema, wrong), ()):
            families = {f.name: f for f in FleetCollector(real_url, runs).collect()}
            assert families["redisync_store_up"].samples[0].value == 1.0
            errors = {s.labels["run"]: s.labels["reason"] for s in families["redisync_run_error"].samples}
            assert {version, schema, wrong} <= set(errors), errors
            assert good not in errors
            exported = {
                s.labels.get("run") for f in families.values() for s in f.samples if f.name != "redisync_run_error"
            }
            assert good in exported
            assert not {version, schema, wrong} & exported  # nothing half-read of a failed run
    finally:
        for store in stores:
            store.delete()
        client.delete(RunKeys(wrong).meta)
        client.close()


def test_the_exporter_starts_while_the_store_is_down_and_says_so_by_store_up(tmp_path):
    """Started before its Redis (a store down, a deploy's order): it serves redisync_store_up 0, then 1
    once the store answers (was: exit 1 at start, so the store-unreadable alert could never fire)."""
    redis_port, port = free_port(), free_port()
    proc = _exporter(f"redis://127.0.0.1:{redis_port}/0", port)
    server = RedisProcess(tmp_path, redis_port)
    try:
        assert _scrape(port)[("redisync_store_up", frozenset())] == 0.0
        server.start()
        assert _scrape(port)[("redisync_store_up", frozenset())] == 1.0
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stderr.close()
        server.stop()


def test_the_exporter_starts_with_a_cluster_url_whose_nodes_are_all_down():
    """A Cluster URL none of whose nodes answers at start (a deploy's order, a Cluster being
    restarted): it serves redisync_store_up 0 (was: exit 1 at start, the Cluster client reading the
    slot map when it is made)."""
    port = free_port()
    proc = _exporter(f"redis+cluster://127.0.0.1:{free_port()}", port)
    try:
        assert _scrape(port)[("redisync_store_up", frozenset())] == 0.0
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        proc.stderr.close()


def test_a_port_in_use_is_said_with_the_port():
    """The exporter's port taken by another process: one line naming the address and port, exit 1."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "redisync.cli", "exporter", "--url", REAL_URL, "--port",
             str(port), "--addr", "127.0.0.1"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 1
    assert f"127.0.0.1:{port}" in out.stderr


@pytest.mark.integration  # a redis-server of its own, paused
def test_a_hung_store_is_store_up_0_from_calls_that_wait_less_than_a_scrape(tmp_path):
    """With the store paused, a scrape took 20.6 s (three retries of 5 s calls), past Prometheus'
    10 s scrape timeout: the target went down and ``redisync_store_up`` vanished with every alert.
    The exporter's calls now wait 2 s each, without a retry, and a paused store reads store_up 0."""
    import os
    import signal

    from redisync.exporter import SCRAPE_CALL_TIMEOUT_S, FleetCollector

    server = RedisProcess(tmp_path).start()
    try:
        collector = FleetCollector(server.url)
        families = {f.name: f for f in collector.collect()}
        assert families["redisync_store_up"].samples[0].value == 1.0
        kwargs = collector._server.redis.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == SCRAPE_CALL_TIMEOUT_S
        assert collector._server.redis.get_retry().get_retries() == 0
        assert 2 * SCRAPE_CALL_TIMEOUT_S < 10  # deploy/prometheus/prometheus.yml's scrape timeout
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            families = {f.name: f for f in collector.collect()}
            assert families["redisync_store_up"].samples[0].value == 0.0
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
    finally:
        server.stop()
