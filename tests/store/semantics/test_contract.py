"""The contract every semantics of the registry keeps: its Lua module folds, refuses and hands out
exactly what its Python module's reference fold does, on fakeredis and on a real Redis.

Parametrised over `redisync.store.semantics.SEMANTICS`, so a semantics added to the registry is run
here with nothing else to write: random report sequences (new reports, duplicates, restarts, zombies,
rollbacks, refused payloads) through both, the same outcome for every report and the same state after.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisync import errors
from redisync.store.codec import encode
from redisync.store.schema import Schema
from redisync.store.semantics import SEMANTICS
from redisync.store.semantics.base import SpecBase

from ...conftest import examples, new_store
from ...reference import ReferenceFold
from ...support import assert_same_state, envelope, lua_state, reference_state, send_as

KINDS = ["publish", "duplicate", "restart", "zombie", "rollback", "corrupt"]
WEIGHTS = np.array([10, 2, 2, 1, 1, 2], dtype=float)
SHARD_IDS = (0, 3, 17)
# a value drawn from these makes ties, signed zeros and order matter (a fold that is not bit for bit fails)
VALUES = np.array([-3.0, -0.0, 0.0, 0.5, 1.0, 2.0, 1e300])


def schema_of(semantics: str) -> Schema:
    """A vector key and a scalar key of the semantics, each as its spec's defaults declare it."""
    spec: type[SpecBase] = SEMANTICS[semantics]
    return Schema.of({"k/vector": spec(shape=(3,)), "k/scalar": spec(shape=())})


def payload(rng: np.random.Generator, spec: SpecBase, corrupt: bool) -> np.ndarray:
    """A flat payload laid out as the spec's parts say: non-negative where a part must be."""
    flat = np.concatenate(
        [
            np.abs(rng.choice(VALUES, size)) if nonneg else rng.choice(VALUES, size)
            for _, _, size, nonneg in spec.payload_parts()
        ]
    )
    if corrupt:
        flat[rng.integers(flat.size)] = rng.choice([np.nan, np.inf, -np.inf])
    return flat


@pytest.mark.parametrize("backend", ["embedded", "real"])
@pytest.mark.parametrize("semantics", sorted(SEMANTICS))
@settings(
    max_examples=examples(20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 40))
def test_the_lua_module_folds_as_the_python_module_does(backend, semantics, seed, length):
    """Every report's outcome (applied, duplicate, rejected with its reason and key) and the state
    after the sequence (versions, values bit for bit, slots, writers) are the reference's."""
    schema = schema_of(semantics)
    names = list(schema.keys)
    rng = np.random.default_rng(seed)
    store = new_store(backend)
    try:
        store.register(schema)
        ref = ReferenceFold(schema)
        clients = [store.shard(sid, incarnation=100 + i) for i, sid in enumerate(SHARD_IDS)]
        last: dict[int, tuple[int, dict]] = {}
        for _ in range(length):
            kind = KINDS[rng.choice(len(KINDS), p=WEIGHTS / WEIGHTS.sum())]
            shard = int(rng.integers(len(SHARD_IDS)))
            chosen = [n for n in names if rng.random() < 0.6] or [names[0]]
            reports = {n: payload(rng, schema.keys[n], kind == "corrupt" and i == 0) for i, n in enumerate(chosen)}
            client = clients[shard]
            inc, seq, reports = envelope(kind, client, last, shard, reports)
            try:
                res = send_as(client, inc, {n: encode([p]) for n, p in reports.items()}, seq)
                got, now = (res.status, None, None), res.server_time_us or 0
            except errors.InvalidReport as e:
                got, now = ("rejected", e.reason, e.key), 0
            if got[0] == "applied":
                client.seq = max(client.seq, seq)
                last[shard] = (seq, reports)
            expected = ref.apply(SHARD_IDS[shard], inc, seq, reports, now)
            assert got == (expected.status, expected.reason, expected.key), (kind, shard)
        assert_same_state(lua_state(store), reference_state(ref), rtol=0)
        # what a collector pulls is the fleet value the reference holds
        pulled = store.shard(SHARD_IDS[0], incarnation=clients[0].incarnation).pull()
        for name in names:
            value = ref.keys[name].value
            view = pulled.keys.get(name)
            if value is None or view is None or view.value is None:
                continue
            assert view.value.tobytes() == value.tobytes(), name
    finally:
        store.delete()


@pytest.mark.parametrize("semantics", sorted(SEMANTICS))
def test_the_library_carries_its_lua_module(semantics):
    """The library's Lua holds the semantics' module under its name (made from the registry)."""
    from redisync.store import library

    assert f"semantics/{semantics}.lua" in library.lua_files()
    assert f"SEMANTICS['{semantics}'] = (function()" in library.source()[0]
