"""A model-based test of a churning fleet: shard ids arrive, report (both keys, or the state key
alone), stop, crash, lapse, come back under a forgotten id, live shards renew between reports, time
passes past the graces, the run is restored from a snapshot. After every step: every sample the
history key was sent is counted once (its retired lives and live slots, exactly), no key holds a slot
of an id the run has forgotten, and an id the run still knows has its whole record. Forgetting and
retiring happen while the store serves, so the rules are the events; the invariants are what no
order of them may break. (A trim that ignored the keys' writers fails it.)"""

from __future__ import annotations

import time
import uuid

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

import redisync
from redisync.store.schema import Limits, Schema, merge

from ..conftest import backend_url, examples

GRACE_S = 0.15
SCHEMA = Schema.of(
    {
        "motion/ema": merge(2, lifecycle="state", lease_grace_s=GRACE_S),
        "obs/norm": merge(2, lifecycle="history", retire_after_s=GRACE_S),
    }
)
LIMITS = Limits(stall_after_s=5.0)  # (the rules' sleeps are served time: no stall cap cuts them)
LIVE_MS = 600_000


class ChurningFleet(RuleBasedStateMachine):
    backend = "embedded"

    @initialize()
    def start(self) -> None:
        self.store = redisync.connect(backend_url(self.backend), run=f"churn-{uuid.uuid4().hex[:10]}")
        self.store.register(SCHEMA, LIMITS)
        self.next_id = 0
        self.clients: dict[int, redisync.ShardClient] = {}  # the processes running, by shard id
        self.sent: dict[tuple[int, int], float] = {}  # (shard, incarnation) -> its last history count folded
        self.saved = None

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.delete()

    def _publish(self, shard: int, count: float) -> None:
        client = self.clients[shard]
        client.publish(
            {"motion/ema": {"count": 1, "sum": [count, 1.0]}, "obs/norm": {"count": count, "sum": [count, 0.5]}}
        )
        self.sent[(shard, client.incarnation)] = count

    @rule(count=st.integers(1, 1000))
    def arrive(self, count):
        """A new process with a fresh shard id claims it, reports and leases."""
        shard, self.next_id = self.next_id, self.next_id + 1
        self.clients[shard] = self.store.shard(shard)
        self._publish(shard, float(count))
        assert self.store.lease(shard, self.clients[shard].incarnation, LIVE_MS)

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), more=st.integers(1, 1000))
    def report(self, data, more):
        """A running process reports its cumulative count, grown, and renews (forgetting what it may)."""
        shard = data.draw(st.sampled_from(sorted(self.clients)))
        client = self.clients[shard]
        self._publish(shard, self.sent[(shard, client.incarnation)] + more)
        self.store.lease(shard, client.incarnation, LIVE_MS)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def renew(self, data):
        """A running process's lease renewed between its reports (a sidecar's clock): no key folded."""
        shard = data.draw(st.sampled_from(sorted(self.clients)))
        self.store.lease(shard, self.clients[shard].incarnation, LIVE_MS)

    @precondition(lambda self: self.clients)
    @rule(data=st.data())
    def report_the_state_key_only(self, data):
        """A report of the EMA alone: the history key is not folded (its departed slots wait)."""
        shard = data.draw(st.sampled_from(sorted(self.clients)))
        self.clients[shard].publish({"motion/ema": {"count": 1, "sum": [1.0, 1.0]}})

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), how=st.sampled_from(["stop", "lapse", "crash"]))
    def depart(self, data, how):
        """A process stops (its lease given up), its lease runs out (1 ms), or it crashes holding a lease."""
        shard = data.draw(st.sampled_from(sorted(self.clients)))
        client = self.clients.pop(shard)
        if how != "crash":
            self.store.lease(shard, client.incarnation, 0 if how == "stop" else 1)

    @precondition(lambda self: self.next_id > 0)
    @rule(data=st.data(), count=st.integers(1, 1000))
    def come_back_fresh(self, data, count):
        """An id seen before comes back as a fresh process (a forgotten id: a new shard)."""
        shard = data.draw(st.integers(0, self.next_id - 1))
        if shard in self.clients:
            return
        self.clients[shard] = self.store.shard(shard)
        self._publish(shard, float(count))
        assert self.store.lease(shard, self.clients[shard].incarnation, LIVE_MS)

    @rule()
    def time_passes(self):
        """Past every grace and the forget horizon (twice the longest grace)."""
        time.sleep(2.2 * GRACE_S)

    @rule()
    def save(self):
        self.saved = (self.store.snapshot(), dict(self.sent), dict(self.clients))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self):
        """The run restored from a saved moment: its slots and retired lives then are the run's again."""
        snap, sent, clients = self.saved
        self.store.restore(snap)
        self.sent = dict(sent)
        # the processes running then and still running now publish their latest again (a new epoch)
        for shard, client in list(self.clients.items()):
            if clients.get(shard) is client:
                self._publish(shard, self.sent.get((shard, client.incarnation), 1.0) + 1)
            else:
                del self.clients[shard]
        self.saved = None

    @invariant()
    def every_history_sample_is_counted_once(self):
        if not hasattr(self, "store"):
            return
        fleet = self.store.fleet()
        if fleet is None or "obs/norm" not in fleet.keys:
            return
        assert fleet.keys["obs/norm"].parts()["count"] == sum(self.sent.values())

    @invariant()
    def no_key_holds_a_forgotten_id_and_known_ids_are_whole(self):
        if not hasattr(self, "store"):
            return
        shards = {k.decode() for k in self.store.redis.hkeys(self.store.keys.shards)}
        known = {int(f.split(":")[0]) for f in shards}
        for shard in known:
            assert f"{shard}:incarnation" in shards, (shard, sorted(f for f in shards if f.startswith(f"{shard}:")))
        for name in SCHEMA.keys:
            writers = self.store.key_info(name).get("writers", "")
            held = {int(w) for w in writers.split(",") if w}
            assert held <= known, (name, held - known)
        assert set(self.clients) <= known


@pytest.mark.parametrize("backend_name", ["embedded", "real"])
def test_a_churning_fleet_counts_every_sample_once_and_forgets_only_what_no_key_holds(backend_name):
    """Shard ids arrive, report, stop, lapse, crash and come back while time passes past the graces and
    the run is restored: every history sample counted once, no key holding a forgotten id."""
    machine = type(f"ChurningFleet_{backend_name}", (ChurningFleet,), {"backend": backend_name})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples(30), stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
        ),
    )
