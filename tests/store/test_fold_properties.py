"""The Lua fold against the pure-Python reference, on fakeredis and on a real Redis.

Hypothesis drives random report sequences — duplicates and retries, reordering between
shards, incarnation changes (and zombies of old incarnations), stale slots, rejected
reports — through both and requires the same outcomes and the same final state.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisync import errors
from redisync.store.codec import encode
from redisync.store.schema import MergeSpec, Schema, broadcast, maximum, merge
from redisync.store.semantics.merge import exact_planes, planes_of

from ..conftest import examples, new_store
from ..reference import ReferenceFold
from ..support import assert_same_state, envelope, lua_state, reference_state, send_as

SCHEMA = Schema.of(
    {
        "motion/ema": merge(3, lifecycle="history"),  # history key: a restarted shard's slot is retired
        # a history key with stale_after_s (merge() refuses one now; a run registered before holds it): a
        # silent shard's slot stays counted, whichever fold notices it
        "obs/norm": MergeSpec(shape=2, stale_after_s=0.003, sumsq=True, lifecycle="history"),
        # wider than the fold's blocks of 32 values, not a multiple of them: the unrolled pass after its head
        # (the first width % 32 values), a block of counts alone after the head (whose counts a later block's
        # checks read back from the aggregate), the count/sum boundary inside a block, per-element counts, and
        # a sumsq part
        "motion/bins": merge(50, elementwise_count=True, stale_after_s=0.003, lifecycle="state"),  # dead slots drop out
        "obs/wide": merge(20, sumsq=True, lifecycle="history"),
        "curriculum/stage": broadcast(2),
        "curriculum/scale": broadcast((), owner=0),
        # grow-only: ties (+0.0 against -0.0 included) keep the stored value, a lower report changes nothing
        "command/range": maximum(3),
        "terrain/level": maximum(()),
    }
)
NAMES = list(SCHEMA.keys)
SHARDS = 6
SHARD_IDS = (0, 1, 5, 9, 17, 40)  # the fold's sums: sub-groups of 4 ids (0-1 share one), groups of 16 (0-9; 17; 40)

KINDS = ["publish", "duplicate", "restart", "zombie", "rollback", "corrupt", "sleep"]
WEIGHTS = np.array([10, 2, 3, 1, 1, 2, 1], dtype=float)


def random_payload(rng: np.random.Generator, name: str, corrupt: bool) -> np.ndarray:
    spec = SCHEMA.keys[name]
    # magnitudes from 1e-3 to 1e6, to stress the rounding, and now and then near or beyond 1e154, whose
    # squares overflow: the fold's cheap look fails and it checks element by element; counts of their
    # own magnitude, down to fractions whose means overflow where the values' squares do not
    # (not for a stale key: a refused fold does not tell the reference the server's time, so it could
    # not tell which slots an overflowing aggregate would have held)
    huge = getattr(spec, "stale_after_s", None) is None and rng.random() < 0.1
    scale = 10.0 ** (rng.choice([150, 160, 250]) if huge else rng.integers(-3, 7))
    count_scale = 10.0 ** rng.integers(-6, 7)
    if spec.semantics == "maximum" and rng.random() < 0.5:
        flat = rng.choice([-0.0, 0.0, 1.0, 2.0, -3.0], spec.size)  # ties and signed zeros
    elif spec.semantics in ("broadcast", "maximum"):
        flat = rng.normal(0, scale, spec.size)
    else:
        sizes = {"count": spec.count_size, "sum": spec.size, "sumsq": spec.size}
        flat = np.concatenate(
            [
                rng.normal(0, scale, sizes[part])
                if part == "sum"
                else rng.uniform(0, count_scale if part == "count" else scale, sizes[part])
                for part in spec.parts
            ]
        )
    assert flat.size == spec.width
    if corrupt:
        flat[rng.integers(flat.size)] = rng.choice([np.nan, np.inf, -np.inf, -1.0])
    return flat


def random_operations(seed: int, length: int, names: list[str] | None = None, shards: int = SHARDS) -> list:
    """A sequence of (kind, shard, {key: payload}); hypothesis picks the seed and the length."""
    rng = np.random.default_rng(seed)
    names = names or NAMES
    ops = []
    for _ in range(length):
        kind = KINDS[rng.choice(len(KINDS), p=WEIGHTS / WEIGHTS.sum())]
        chosen = [n for n in names if rng.random() < 0.5] or [names[rng.integers(len(names))]]
        rng.shuffle(chosen)
        payloads = {n: random_payload(rng, n, corrupt=(kind == "corrupt" and i == 0)) for i, n in enumerate(chosen)}
        ops.append((kind, int(rng.integers(shards)), payloads))
    return ops


def run_sequence(store, ops) -> None:
    store.register(SCHEMA)
    ref = ReferenceFold(SCHEMA)
    clients = {s: store.shard(SHARD_IDS[s], incarnation=1000 + s) for s in range(SHARDS)}
    last: dict[int, tuple[int, dict]] = {}
    merges_applied = 0
    for kind, shard, payloads in ops:
        c = clients[shard]
        if kind == "sleep":
            time.sleep(0.005)
            continue
        inc, seq, payloads = envelope(kind, c, last, shard, payloads)
        try:
            res = send_as(c, inc, {n: encode([p]) for n, p in payloads.items()}, seq)
            got, now = (res.status, None, None), res.server_time_us or 0
        except errors.InvalidReport as e:
            got, now = ("rejected", e.reason, e.key), 0
        if got[0] == "applied":
            c.seq = max(c.seq, seq)
            last[shard] = (seq, payloads)
            merges_applied += any(SCHEMA.keys[n].semantics == "merge" for n in payloads)
        expected = ref.apply(SHARD_IDS[shard], inc, seq, payloads, now)
        assert got == (expected.status, expected.reason, expected.key), (kind, shard)
        if got[0] == "duplicate":
            assert res.fleet_version == expected.fleet_version
    assert_same_state(lua_state(store), reference_state(ref))
    # a generator that only produced refusals would make this test vacuous
    assert merges_applied > 0 or sum(k == "publish" for k, _, _ in ops) < 10
    # the reference itself: the aggregate is the sum of the live slots and the retired history
    for name, key in ref.keys.items():
        if ref.specs[name].semantics == "merge":
            parts = [s.payload for s in key.slots.values()] + (list(key.retired) if key.retired is not None else [])
            exact = np.sum(parts, axis=0) if parts else np.zeros(ref.specs[name].width)
            scale = max(1e6, max((float(np.abs(p).max()) for p in parts), default=0.0)) * (1 + ref.fleet_version)
            assert np.allclose(key.value, exact, rtol=0, atol=1e-12 * scale), name


@pytest.mark.parametrize("backend", ["embedded", "real"])
@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 80))
def test_lua_fold_matches_reference(backend, seed, length):
    """The Lua fold and the reference fold agree byte for byte over random sequences of operations, on either
    backend."""
    store = new_store(backend)
    try:
        run_sequence(store, random_operations(seed, length))
    finally:
        store.delete()


@pytest.mark.parametrize("backend", ["embedded", "real"])
@settings(max_examples=examples(25), deadline=None)
@given(
    n_shards=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
    publishes=st.integers(1, 4),
    loc=st.floats(-5, 5),
    scale=st.floats(0.1, 10),
)
def test_sharded_statistics_equal_the_unsharded_ones(backend, n_shards, seed, publishes, loc, scale):
    """N shards publishing cumulative stats of disjoint slices == one shard with all samples (1e-9)."""
    rng = np.random.default_rng(seed)
    samples = rng.normal(loc, scale, size=(int(rng.integers(n_shards, 400)), 3))
    schema = Schema.of({"obs/norm": merge(3, sumsq=True, lifecycle="history")})
    store = new_store(backend)
    try:
        store.register(schema)
        slices = np.array_split(samples, n_shards)
        clients = [store.shard(s) for s in range(n_shards)]
        for p in range(1, publishes + 1):  # cumulative reports: each one carries everything so far
            for client, chunk in zip(clients, slices, strict=False):
                seen = chunk[: len(chunk) * p // publishes]
                client.publish({"obs/norm": {"count": len(seen), "sum": seen.sum(0), "sumsq": (seen**2).sum(0)}})
        view = store.fleet().keys["obs/norm"]
        mean, var = view.moments()
        assert np.allclose(view.parts()["count"], len(samples), rtol=0, atol=0)
        np.testing.assert_allclose(mean, samples.mean(0), rtol=1e-9, atol=1e-9 * scale)
        np.testing.assert_allclose(var, samples.var(0), rtol=1e-9, atol=1e-9 * scale**2)
    finally:
        store.delete()


@pytest.mark.parametrize("width", [1, 40])  # the head's loop alone; a head and a generated block
def test_a_rest_carried_past_its_53_bits_is_made_two_planes_again_without_the_general_path(make_store, width):
    """The usual fold adds into two planes with two-sums; where the rest plane already uses its 53 bits
    and the addition carries, its sum has an error of its own. The exact value still fits two planes
    (2^60 + 2^7 + 2^-46: the first plane rounds up to 2^60 + 2^8, the rest is -(2^7 - 2^-46)), which the
    fold stores - the canonical planes, bit for bit - instead of taking the general path for the key.
    (Built from three slots: 2^60, 2^7 - 2^-46 (53 bits), then a third shard's 2^-45.)"""
    store = make_store()
    store.register({"obs/sums": merge(width, lifecycle="history")})
    parts = {1: 2.0**60, 2: 2.0**7 - 2.0**-46, 3: 2.0**-45}
    for shard, value in parts.items():
        store.shard(shard).publish({"obs/sums": {"count": 1, "sum": [value] * width}})
    raw = store.redis.hgetall(store.keys.key_data("obs/sums"))
    planes = planes_of(raw[b"agg"], raw[b"agg_lo"], width + 1)
    want = exact_planes([np.array([1.0] + [v] * width) for v in parts.values()], width + 1)
    assert planes.tobytes() == want.tobytes()
    assert planes[0, 1] == 2.0**60 + 2.0**8
    assert planes[1, 1] == -(2.0**7 - 2.0**-46)
