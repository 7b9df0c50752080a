"""The reference folds the exact fold is measured against compute what they claim (a floor that
computed less would flatter the fold's ratio)."""

from __future__ import annotations

import uuid

import numpy as np
import redis

from redisync.bench.floors import FLOOR_ADD, PLAIN_FOLD, payloads


def test_the_reference_folds_sum_what_they_are_sent_and_the_payloads_are_the_folds(real_url):
    """floor_add keeps the running sum of every payload; the plain fold keeps the aggregate less the
    slot it replaces plus the new payload; both on vectors longer than one struct call takes."""
    r = redis.Redis.from_url(real_url)
    keys = [f"t-floors-{uuid.uuid4().hex[:8]}:{i}" for i in range(2)]
    rng = np.random.default_rng(0)
    a, b, big = rng.random(1025), rng.random(513), rng.random(16_385)
    try:
        for _ in range(3):
            r.eval(FLOOR_ADD, 2, *keys, a.tobytes(), big.tobytes())
        np.testing.assert_allclose(np.frombuffer(r.hget(keys[0], "agg"), "<f8"), 3 * a, rtol=1e-15)
        np.testing.assert_allclose(np.frombuffer(r.hget(keys[1], "agg"), "<f8"), 3 * big, rtol=1e-15)
        r.delete(*keys)
        r.eval(PLAIN_FOLD, 2, *keys, "slot:0", a.tobytes(), b.tobytes())
        r.eval(PLAIN_FOLD, 2, *keys, "slot:1", b[:1].repeat(1025).tobytes(), b.tobytes())
        r.eval(PLAIN_FOLD, 2, *keys, "slot:0", (2 * a).tobytes(), b.tobytes())  # slot 0 replaced
        np.testing.assert_allclose(np.frombuffer(r.hget(keys[0], "agg"), "<f8"), 2 * a + b[0], rtol=1e-12)
    finally:
        r.delete(*keys)
    report = {"k": {"count": 3.0, "sum": np.arange(4.0), "sumsq": np.ones(4)}}
    assert payloads(report) == [np.array([3.0, 0, 1, 2, 3, 1, 1, 1, 1], "<f8").tobytes()]
