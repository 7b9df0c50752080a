"""The fleet does not depend on fold order: a stale slot, or one whose shard's lease lapsed, has the
same fate whichever shard's fold notices it — dropped from a state key, kept (counted) in a history
key, as the shard's own fresh restart would retire it. A property of the reference fold over
permuted batches of folds at one moment, and the scenario that showed it on both backends."""

from __future__ import annotations

import copy
import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from redisync.store.schema import Limits, MergeSpec, Schema, merge

from ..conftest import examples
from ..reference import ReferenceFold
from ..support import assert_same_state, reference_state

SCHEMA = Schema.of(
    {
        # a history key with stale_after_s, as a run registered before merge() refused one holds it
        "obs/norm": MergeSpec(shape=2, stale_after_s=1.0, lifecycle="history"),
        "motion/ema": merge(2, stale_after_s=1.0, lifecycle="state", lease_grace_s=1.0),
    }
)
SHARDS = (0, 1, 4, 17)
S = 1_000_000  # a second, in the fold's microseconds


def _payload(rng: np.random.Generator, count: float) -> np.ndarray:
    return np.concatenate([[count], rng.normal(0, 10, 2)])


@settings(max_examples=examples(300), deadline=None)
@given(
    seed=st.integers(0, 2**16),
    lapsed=st.sets(st.sampled_from(SHARDS)),  # shards whose lease ran out (dead for good, or silent)
    # one fold per shard (a shard's own folds come in its order; the question is between shards)
    events=st.dictionaries(st.sampled_from(SHARDS), st.booleans(), min_size=1),
    order=st.randoms(use_true_random=False),
)
def test_a_batch_of_folds_ends_in_the_same_fleet_in_any_order(seed, lapsed, events, order):
    """A batch of folds, lapses and restarts ends in the same fleet whatever order the folds arrive in."""
    rng = np.random.default_rng(seed)
    ref = ReferenceFold(SCHEMA, Limits(stall_after_s=3600))  # (the batch's times are all served)
    inc = {}
    for shard in SHARDS:  # everyone publishes at t = 0 and leases: the lapsed ones until t = 0.5 s
        inc[shard] = ref.claim(shard, now_us=shard + 1)
        ref.lease(shard, inc[shard], 0, 500 if shard in lapsed else 100_000)
        reports = {"obs/norm": _payload(rng, 100.0), "motion/ema": _payload(rng, 1.0)}
        assert ref.apply(shard, inc[shard], 1, reports, now_us=0).status == "applied"
    # at t = 5 s every slot is stale and the lapsed leases are past their grace; one batch of folds:
    # a shard publishing again, or a fresh restart of it (a new incarnation) publishing
    batch = []
    for k, (shard, restart) in enumerate(sorted(events.items())):
        batch.append((k, shard, restart, {"obs/norm": _payload(rng, 7.0), "motion/ema": _payload(rng, 1.0)}))
    shuffled = list(batch)
    order.shuffle(shuffled)
    ends = []
    for sequence in (batch, shuffled):
        r = copy.deepcopy(ref)
        lives = dict(inc)
        seqs = {shard: 1 for shard in SHARDS}
        restarted = {k: None for k, *_ in batch}
        for k, shard, restart, reports in sequence:
            if restart and restarted[k] is None:  # the same restart, whatever its place in the batch
                restarted[k] = True
                lives[shard] = 10 * S + 100 * k + shard
                r.shards[shard].incarnation = lives[shard] - 1  # (what claim() does, at a fixed incarnation)
                r.claimed[shard] = lives[shard] - 1
                seqs[shard] = 0
            seqs[shard] += 1
            r.apply(shard, lives[shard], seqs[shard], reports, now_us=5 * S)
        ends.append(r)
    a, b = (reference_state(r) for r in ends)
    # the same live slots (ids, lives, what they hold), versions and shards; sums within rounding (the
    # retired history adds restarts in the order they came)
    for state in (a, b):
        for key in state["keys"].values():
            key["incarnations"] = {sid: slot[0] for sid, slot in key["slots"].items()}
    assert {n: k["incarnations"] for n, k in a["keys"].items()} == {n: k["incarnations"] for n, k in b["keys"].items()}
    for state in (a, b):
        for key in state["keys"].values():
            key["slots"] = {sid: (0, 0, payload) for sid, (_, _, payload) in key["slots"].items()}
            del key["incarnations"]
    a["shards"] = b["shards"] = {}
    assert_same_state(a, b, rtol=1e-12)


def test_a_dead_shards_stale_history_slot_counts_whichever_fold_notices_it(make_store):
    """The scenario: a history key with stale_after_s; shard 1 dies after 100 samples and restarts
    fresh; shard 0 folds around the restart. The fleet count was 107 in one order and 7 in the other
    (a stale slot retired by its own shard's fold, dropped by another's)."""
    counts = []
    for own_first in (True, False):
        store = make_store()
        store.register(Schema.of({"obs/norm": MergeSpec(shape=1, stale_after_s=0.2, lifecycle="history")}))
        zero, dead = store.shard(0), store.shard(1)
        zero.publish({"obs/norm": {"count": 0.0, "sum": [0.0]}})
        dead.publish({"obs/norm": {"count": 100.0, "sum": [1.0]}})
        time.sleep(0.3)  # shard 1's slot is stale now
        again = store.shard(1)  # its fresh restart
        folds = [
            lambda again=again: again.publish({"obs/norm": {"count": 7.0, "sum": [1.0]}}),
            lambda zero=zero: zero.publish({"obs/norm": {"count": 0.0, "sum": [0.0]}}),
        ]
        for fold in folds if own_first else folds[::-1]:
            fold()
        counts.append(float(store.fleet().keys["obs/norm"].parts()["count"]))
    assert counts == [107.0, 107.0]
