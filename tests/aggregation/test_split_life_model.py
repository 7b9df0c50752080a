"""A model-based test of a split run's life: hypothesis drives the events its collectors and
aggregators live through — reports, a collector's fresh restart, an aggregator killed and started
again, a second aggregator for a live sub-run, the root's store or a sub-run's store restarted empty —
and after every step, once each live aggregator has made its rounds (the bounded catch-up: one
period and one fold each way), the root and every sub-run hold the exact pooled fleet: the correctly
rounded sum of every collector's last report, bit for bit (whole numbers and adversarial ones:
±2^1000, ±1e300, subnormals, 0.1), the maximum of every level reported."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from redisync import errors, maximum, merge
from redisync.aggregation import Aggregator, split
from redisync.store.schema import Schema

from ..conftest import examples, new_store

SCHEMA = Schema.of({"obs/norm": merge(2, lifecycle="history"), "terrain/level": maximum(1)})
SUBRUNS, COLLECTORS = 2, 5


class SplitRunLife(RuleBasedStateMachine):
    """The model: each collector's cumulative own statistics (what its next report carries) and the
    highest level ever reported."""

    def __init__(self, backend: str):
        super().__init__()
        self.backend = backend

    @initialize()
    def start(self) -> None:
        self.root = new_store(self.backend, f"t-life-{uuid.uuid4().hex[:10]}")
        self.names = split(self.root, SUBRUNS)
        self.shards = {}
        self.cumulative = {k: np.zeros(3) for k in range(COLLECTORS)}  # count, sum[0], sum[1]
        self.level = 0.0
        self.published = set()
        self.aggregators = [Aggregator(self.root, j) for j in range(SUBRUNS)]
        for k in range(COLLECTORS):
            self._connect(k)

    def _connect(self, k: int) -> None:
        home = self.root.home(k)
        home.register(SCHEMA)
        self.shards[k] = home.shard(k, resume=True)

    def _publish(self, k: int) -> None:
        c = self.cumulative[k]
        self.shards[k].publish({"obs/norm": {"count": float(c[0]), "sum": c[1:].tolist()},
                                "terrain/level": {"value": [self.level_of[k]]}})  # fmt: skip
        self.published.add(k)

    @rule(k=st.integers(0, COLLECTORS - 1), samples=st.integers(1, 20), level=st.integers(0, 9))
    def report(self, k: int, samples: int, level: int) -> None:
        """A collector saw ``samples`` more samples and reports its cumulative own statistics."""
        self.cumulative[k] += np.array([samples, 2.0 * samples, -1.0 * samples])
        self.level_of = getattr(self, "level_of", {})
        self.level_of[k] = float(max(self.level_of.get(k, 0.0), level))
        self.level = max(self.level, float(level))
        self._publish(k)

    @rule(
        k=st.integers(0, COLLECTORS - 1),
        value=st.sampled_from([2.0**1000, -(2.0**1000), 1e300, -1e300, 5e-324, -5e-324, 1e-300, 0.1, -0.3, 1.0]),
    )
    def adversarial_report(self, k: int, value: float) -> None:
        """A collector's cumulative sum becomes a value where rounding or range bites (a sum of such
        values over a sub-run is beyond one slot's 2^1000, or cancels to what a rounded forward loses)."""
        self.cumulative[k][1] = value
        self.level_of = getattr(self, "level_of", {})
        self.level_of.setdefault(k, 0.0)
        self._publish(k)

    @rule(j=st.integers(0, SUBRUNS - 1))
    def aggregator_killed_and_restarted(self, j: int) -> None:
        """Sub-run j's aggregator dies (no clean stop) and another takes its place once its lease has
        run out (here: given up for it, as the lease's end would)."""
        old = self.aggregators[j]
        old.release()
        split(self.root, SUBRUNS)  # what `redisync aggregate --subruns` does first: a lost root is split again
        self.aggregators[j] = Aggregator(self.root, j)

    @rule(j=st.integers(0, SUBRUNS - 1))
    def a_second_aggregator_is_refused(self, j: int) -> None:
        """A second aggregator for a live sub-run is refused and takes nothing over."""
        self._settle()  # (the live one holds its shards)
        split(self.root, SUBRUNS)
        with pytest.raises(errors.ShardInUse):
            Aggregator(self.root, j).step()

    @rule()
    def root_lost(self) -> None:
        """The root's store restarted empty (its sub-runs, on other primaries, kept)."""
        self.root.delete()

    @precondition(lambda self: bool(self.published))
    @rule(j=st.integers(0, SUBRUNS - 1))
    def sub_run_lost_and_reseeded(self, j: int) -> None:
        """Sub-run j's store restarted empty; its collectors register again and re-publish."""
        self.root.sibling(self.names[j]).delete()
        for k in [k for k in self.published if k % SUBRUNS == j]:
            self._connect(k)
            self._publish(k)

    def _settle(self) -> None:
        for _ in range(3):
            for a in self.aggregators:
                a.step()

    @invariant()
    def root_and_sub_runs_hold_the_exact_fleet(self) -> None:
        if not getattr(self, "published", None):
            return
        self._settle()
        want = np.array([math.fsum(self.cumulative[k][i] for k in self.published) for i in range(3)])
        for store in (self.root, *(self.root.sibling(n) for n in self.names)):
            keys = store.fleet().keys
            parts = keys["obs/norm"].parts()
            np.testing.assert_array_equal(
                np.concatenate([np.atleast_1d(parts["count"]), parts["sum"]]), want, err_msg=store.run
            )
            level = max(self.level_of[k] for k in self.published)
            assert float(np.asarray(keys["terrain/level"].parts()["value"]).ravel()[0]) == level, store.run

    def teardown(self) -> None:
        for name in getattr(self, "names", []):
            self.root.sibling(name).delete()
        if hasattr(self, "root"):
            self.root.delete()


@pytest.mark.parametrize("backend", ["embedded", "real"])
def test_a_split_run_stays_exact_through_its_life(backend):
    """Random lives of a split run: its root and sub-runs hold the exact pooled fleet after every event."""
    if backend == "real":
        from ..conftest import real_redis_or_skip

        real_redis_or_skip()
    run_state_machine_as_test(
        lambda: SplitRunLife(backend),
        settings=settings(
            max_examples=examples(40), stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
