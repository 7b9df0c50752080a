"""One set of rules for both workers: the same reports — valid, invalid, odd dtypes, tensors that
require grad, ``None`` parts, wrong shapes, non-finite values — have the same outcome whichever
worker runs: the same bytes reach the store, or the same typed reason shows in ``health()``; the hot
path never raises into the training loop."""

from __future__ import annotations

import os
import re
import time
import uuid

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redisync
from redisync.collector.workers import new_syncer
from redisync.store.schema import broadcast, merge

from ..conftest import examples, real_redis_or_skip

SCHEMA = {
    "a/norm": merge(2, sumsq=True, lifecycle="history"),
    "a/ema": merge(2, lifecycle="state"),
    "a/scale": broadcast(()),
}


class Scripted:
    """A term whose report is whatever the test sets."""

    def __init__(self):
        self.report: dict = {}

    def schema_entries(self):
        return SCHEMA

    def report_shard_state(self):
        return self.report

    def apply_shard_state(self, fleet):
        pass


def _cast(values: list[float], dtype: str) -> np.ndarray:
    """``values`` in ``dtype``, overflowing where they do (a NaN or 1e300 as int64 or float16: what a
    careless caller reports), without numpy's warning about it."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.array(values).astype(dtype)


def _numbers(shape: tuple[int, ...]):
    size = int(np.prod(shape)) if shape else 1
    finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    odd = st.sampled_from([float("nan"), float("inf"), -1.0, 0.0, -0.0, 1e300])
    values = st.lists(st.one_of(finite, odd), min_size=size, max_size=size)
    return st.one_of(
        values.map(lambda v: np.array(v, dtype=np.float64).reshape(shape)),  # the terms' own form
        values.map(lambda v: v if shape else v[0]),  # plain Python numbers
        st.tuples(values, st.sampled_from(["float32", "float16", "int64", "bool"])).map(
            lambda t: _cast(t[0], t[1]).reshape(shape)
        ),
        st.tuples(values, st.booleans()).map(
            lambda t: torch.tensor(t[0], dtype=torch.float32, requires_grad=t[1]).reshape(shape)
        ),
        values.map(lambda v: np.array([*v, 1.0]).reshape(-1, 1)),  # a shape that does not broadcast
        values.map(lambda v: np.array(v).reshape(*shape, 1) if shape else np.array([v[0]])),  # (2, 1), or (1,)
        st.just("seven"),
        st.none(),
    )


REPORTS = st.fixed_dictionaries(
    {},
    optional={
        "a/norm": st.fixed_dictionaries({"count": _numbers(()), "sum": _numbers((2,)), "sumsq": _numbers((2,))}),
        "a/ema": st.fixed_dictionaries({"count": _numbers(()), "sum": _numbers((2,))}, optional={"sumsq": st.none()}),
        "a/scale": st.fixed_dictionaries({"value": _numbers(())}),
    },
).filter(bool)


@pytest.fixture(scope="module")
def workers():
    url = real_redis_or_skip()
    made = {}
    for worker in ("thread", "process"):
        store = redisync.connect(url, run=f"parity-{worker}-{uuid.uuid4().hex[:8]}-{os.getpid()}")
        term = Scripted()
        term.report = {"a/ema": {"count": 1.0, "sum": np.zeros(2)}}
        syncer = new_syncer(store, 0, [term], worker=worker, publish_every_steps=10**9, publish_every_s=1e9).start()
        made[worker] = (store, term, syncer)
    yield made
    for store, _, syncer in made.values():
        syncer.stop(flush=False)
        store.delete()


# how a report handed to a worker ends: folded (or found folded already), or refused (by the store,
# or by the collector before it was sent)
FOLDED = ("publishes", "duplicates")
REFUSED = ("rejected", "rejected_before_sending", "mailbox_overflows")


def _ended(syncer) -> tuple[int, int]:
    metrics = syncer.metrics()
    return tuple(sum(int(metrics.get(f"redisync/{name}", 0)) for name in names) for names in (FOLDED, REFUSED))


def _settle(syncer, before: tuple[int, int]) -> None:
    """Wait until the report handed over after the ``before`` counts has ended, and what it left is
    visible: a fold pulled back (``wait_synced``), a refusal in ``health()``. Decided by the counts
    and states, not by a time limit: the deadline only ends a test that would otherwise hang."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        folded, refused = _ended(syncer)
        ok = syncer.health()["ok"]
        if folded > before[0] and ok and syncer.wait_synced(timeout=1):
            return
        if refused > before[1] and not ok:
            return
        time.sleep(0.01)
    raise AssertionError(f"the report had no outcome in 120 s: {syncer.health()}")


def _outcome(store, syncer) -> tuple:
    """What reached the store (every key's stored bytes) and the typed reason health() gives."""
    stored = []
    for name in SCHEMA:
        data = store.redis.hgetall(store.keys.key_data(name))
        stored.append(tuple(sorted((k, v) for k, v in data.items() if k in (b"agg", b"value", b"slot:0"))))
    health = syncer.health()
    reason = "ok" if health["ok"] else (re.findall(r"\[(\w+)\]", health["error"]) or [health["error"]])[-1]
    return tuple(stored), reason


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(report=REPORTS)
def test_both_workers_give_the_same_report_the_same_outcome(workers, report):
    """Any report, well-formed or not, has the same outcome with either worker: published, or refused
    with the same typed reason in health(); the hot path never raises."""
    outcomes = {}
    for worker, (store, term, syncer) in workers.items():
        term.report = report
        before = _ended(syncer)
        syncer.on_step()  # the hot path: never raises, whatever the report holds
        syncer.flush()
        _settle(syncer, before)
        outcomes[worker] = _outcome(store, syncer)
    assert outcomes["thread"] == outcomes["process"], report
