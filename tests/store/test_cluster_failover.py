"""A fleet on a Redis Cluster of three primaries with a replica each lives through a manual failover
and a killed primary, with an unrelated node paused meanwhile: nothing lost, nothing counted twice,
and the runs on healthy primaries go on while the dead primary is down."""

from __future__ import annotations

import os
import signal
import time

import pytest

import redisync
from redisync.store.schema import merge

from ..servers import LoopbackCluster
from ..support import wait_for

pytestmark = pytest.mark.integration  # six redis-server processes of its own

KEY = "obs/n"


class Counter:
    """A collector's cumulative count of samples (a history key: the fleet's is the exact sum)."""

    key = KEY

    def __init__(self) -> None:
        self.n = 0
        self.fleet = 0.0

    def schema_entries(self):
        return {KEY: merge(1, lifecycle="history")}

    def report_shard_state(self):
        return {KEY: {"count": float(self.n), "sum": [float(self.n)]}}

    def apply_shard_state(self, fleet) -> None:
        view = fleet.keys.get(KEY)
        if view is not None and view.value is not None:
            self.fleet = float(view.parts()["count"])


def runs_on_each_primary(cluster: LoopbackCluster) -> list[str]:
    """One run name per primary (its hash tag's slot served there), in the primaries' order."""
    found: dict[int, str] = {}
    for i in range(1000):
        name = f"failover-{i}"
        found.setdefault(cluster.primary_of(f"redisync:{{{name}}}:meta").port, name)
        if len(found) == 3:
            return list(found.values())
    pytest.fail("no run name for every primary")


def test_a_fleet_lives_through_a_failover_and_a_killed_primary_with_an_unrelated_node_paused(tmp_path):
    """Three runs of two collectors each, one run per primary. A manual failover of run A's primary,
    then run B's primary SIGKILLed while its replica (every client's default node, unrelated to runs
    A and C) is paused: once the cluster has flagged the primary failed, runs A and C fold on, and at
    the end every run's fleet count is the sum of its collectors' last reports (none lost, none
    counted twice). With cluster-require-full-coverage yes, runs A and C stop with run B."""
    cluster = LoopbackCluster(tmp_path, primaries=3, replicas=1).start()
    syncers, counters = {}, {}
    try:
        a, b, c = runs_on_each_primary(cluster)
        primary = {run: cluster.primary_of(f"redisync:{{{run}}}:meta") for run in (a, b, c)}
        for run in (a, b, c):
            for shard in (0, 1):
                store = redisync.connect(cluster.url, run=run, socket_timeout=1.0, socket_connect_timeout=1.0)
                term = Counter()
                counters[run, shard] = term
                syncers[run, shard] = redisync.new_syncer(
                    store,
                    shard,
                    [term],
                    worker="thread",
                    publish_every_steps=1,
                    poll_every_s=0.1,
                    retry_every_s=0.1,
                ).start()
        readers = {run: redisync.connect(cluster.url, run=run, socket_timeout=1.0) for run in (a, b, c)}

        def step(rounds: int) -> None:
            for _ in range(rounds):
                for key, syncer in syncers.items():
                    counters[key].n += 1
                    syncer.on_step()
                    syncer.at_reset_boundary()
                time.sleep(0.01)

        def fleet_version(run: str) -> int:
            return readers[run].fleet().fleet_version

        step(20)

        # 1. a manual failover of run A's primary: its replica takes over, the run goes on
        replica = cluster.replica_of(primary[a])
        cluster.client(replica).execute_command("CLUSTER", "FAILOVER")
        assert wait_for(lambda: cluster.role(replica) == "master", timeout=30)
        cluster.wait_ok()
        step(20)

        # 2. run B's primary killed while its replica, every client's default node and unrelated to runs A
        # and C, is paused: run B's slots have no primary until the replica is back, the other runs go on
        paused = cluster.replica_of(primary[b])
        for syncer in syncers.values():
            syncer.store.redis.set_default_node(syncer.store.redis.get_node(host="127.0.0.1", port=paused.port))
        os.kill(paused.proc.pid, signal.SIGSTOP)
        try:
            primary[b].kill()
            assert wait_for(lambda: (step(1), cluster.failed(primary[b], paused))[1], timeout=60)
            before = {run: fleet_version(run) for run in (a, c)}
            step(60)
            during = {run: fleet_version(run) for run in (a, c)}
        finally:
            os.kill(paused.proc.pid, signal.SIGCONT)
        assert all(during[run] > before[run] for run in (a, c)), (before, during)
        cluster.wait_ok(timeout=60)  # run B's replica promoted
        step(20)

        # 3. every run exact: its fleet count is the sum of its collectors' last reports
        for syncer in syncers.values():
            syncer.flush()

        def counts(run: str) -> tuple[float, int]:
            """The run's fleet count and the sum of its collectors' last reports."""
            return float(readers[run].fleet().keys[KEY].parts()["count"]), sum(counters[run, s].n for s in (0, 1))

        def exact() -> bool:
            step(1)
            try:
                return all(fleet == reported for fleet, reported in map(counts, (a, b, c)))
            except redisync.errors.ConnectionUnavailable:  # (a reader that still asked the dead node: it asks anew)
                return False

        assert wait_for(exact, timeout=60), {run: counts(run) for run in (a, b, c)}
        for run in (a, b, c):
            assert not [d for d in readers[run].dead_letters(100) if d.get("reason") != "stale_incarnation"]
    finally:
        for syncer in syncers.values():
            syncer.stop(flush=False, timeout=2)
        cluster.stop()
