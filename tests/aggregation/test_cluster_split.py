"""On a Redis Cluster a split run's sub-runs land on different primaries, and the run of collectors
spread over them is exact: the tree bench's own run, small, checked by what it found."""

from __future__ import annotations

import numpy as np
import pytest

import redisync
from redisync.aggregation import Aggregator, split
from redisync.bench.tree import SCHEMA, report, run_tree

from ..servers import LoopbackCluster

pytestmark = pytest.mark.integration  # three redis-server processes of its own


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LoopbackCluster(tmp_path_factory.mktemp("cluster"), primaries=3).start()
    yield c
    c.stop()


def test_the_sub_runs_of_a_split_land_on_every_primary_and_sum_exactly(cluster):
    """Three sub-runs, one per primary (their slots' owners differ); twelve collectors spread over
    them through `Store.home`; after the aggregators' rounds the root and every sub-run hold the
    sum of every collector's report."""
    root = redisync.connect(cluster.url, run="split-on-cluster")
    names = split(root, 3)
    assert len({cluster.primary_of(f"redisync:{{{name}}}:meta").port for name in names}) == 3
    shards = {}
    for k in range(12):
        home = root.home(k)
        home.register(SCHEMA)
        shards[k] = home.shard(k)
        shards[k].publish(report(k, 3))
    aggregators = [Aggregator(root, j) for j in range(3)]
    for _ in range(2):
        for a in aggregators:
            a.step()
    want = sum(report(k, 3)["obs/norm"]["count"] for k in shards)
    for store in (root, *(root.sibling(n) for n in names)):
        view = store.fleet().keys["obs/norm"]
        assert float(view.parts()["count"]) == want
        np.testing.assert_array_equal(view.parts()["sum"], sum(report(k, 3)["obs/norm"]["sum"] for k in shards))


def test_the_tree_bench_ends_exact_with_staleness_of_about_one_round(cluster):
    """`redisync bench --tree`, small: every collector published and pulled, the subscriptions got
    the announcements, the root equals the sum of the last reports, and a value published in one
    sub-run showed in the others and the root (each probe seen)."""
    result = run_tree(cluster.url, collectors=24, seconds=8.0, processes=2, threads=4)
    assert result["exact"], result
    assert result["client_errors"] == 0
    assert result["publishes_per_s"] > 0
    assert result["pulls_per_s"] > 0
    assert result["announcements_delivered_per_s"] > 0
    assert all(s is not None and s["n"] >= 1 for s in result["staleness_s"].values()), result["staleness_s"]
    assert len(result["per_primary"]) == 3
