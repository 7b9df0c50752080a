"""A collector's life cycle, one test per problem of the life-cycle issue, on both backends.

Restarts and resumes, clock skew, cancellation, overflow, half-failed folds, restores, lost writes,
the Syncer's honesty and reports for runs that do not exist.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import redis
import torch

import redisync
from redisync import errors
from redisync.collector.syncer import Syncer
from redisync.collector.workers import new_syncer
from redisync.store.schema import Schema, broadcast, merge
from redisync.terms.torch import AdaptiveMotionSampler, SyncedEmpiricalNormalization

from ..faults import SilentServer
from ..support import run_contents, wait_for

FRAMES = 20 * 50 - 1  # 20 one-second bins


def scalar(x) -> float:
    return float(np.ravel(x)[0])


def state_bytes(store) -> dict:
    return store.snapshot().hashes


# 1. restarts and resumes ------------------------------------------------------------------------


def test_a_fresh_restart_drops_a_state_slot_and_retires_a_history_slot(make_store):
    """A fresh restart (no resume): a state key keeps only the newest life's slot, a history key keeps every
    life's samples, each counted once."""
    store = make_store()
    store.register({"motion/ema": merge(2, lifecycle="state"), "obs/norm": merge(2, lifecycle="history")})
    first = store.shard(0)
    first.publish({"motion/ema": {"count": 1, "sum": [3.0, 1.0]}, "obs/norm": {"count": 10, "sum": [5.0, 5.0]}})
    for _life in range(3):  # each further restart adds nothing to the state key
        again = store.shard(0)
        again.publish({"motion/ema": {"count": 1, "sum": [0.5, 0.25]}, "obs/norm": {"count": 2, "sum": [1.0, 1.0]}})
    fleet = store.fleet().keys
    np.testing.assert_array_equal(fleet["motion/ema"].parts()["sum"], [0.5, 0.25])
    assert fleet["motion/ema"].parts()["count"] == 1
    assert fleet["obs/norm"].parts()["count"] == 10 + 2 * 3  # every life's samples, each counted once


def test_a_resumed_shard_takes_over_its_slot_for_both_kinds(make_store):
    """A process resuming its own cumulative statistics replaces its previous life's slot, state and history
    keys alike: its pull counts that slot as its own, never as the others'."""
    store = make_store()
    store.register({"motion/ema": merge(2, lifecycle="state"), "obs/norm": merge(2, lifecycle="history")})
    store.shard(1).publish({"motion/ema": {"count": 1, "sum": [1.0, 1.0]}, "obs/norm": {"count": 4, "sum": [4.0, 4.0]}})
    store.shard(0).publish(
        {"motion/ema": {"count": 1, "sum": [3.0, 1.0]}, "obs/norm": {"count": 10, "sum": [5.0, 5.0]}}
    )
    resumed = store.shard(0, resume=True)  # a checkpoint holding the cumulative statistics above
    view = resumed.pull().keys["obs/norm"]
    own_now = {"count": 11, "sum": [6.0, 6.0]}
    np.testing.assert_array_equal(view.view(own_now)["count"], 4 + 11)  # the previous life is own data, not others'
    resumed.publish({"motion/ema": {"count": 1, "sum": [3.0, 1.5]}, "obs/norm": own_now})
    fleet = store.fleet().keys
    np.testing.assert_array_equal(fleet["motion/ema"].parts()["sum"], [4.0, 2.5])  # not counted twice
    assert fleet["obs/norm"].parts()["count"] == 15
    assert b"retired" not in store.redis.hgetall(store.keys.key_data("obs/norm"))  # nothing kept twice as history


def test_resume_can_name_single_keys(make_store):
    """``resume`` names single keys: the named key's slot is taken over, an unnamed history key's old life is
    retired and the new one added."""
    store = make_store()
    store.register({"motion/ema": merge(1, lifecycle="state"), "obs/norm": merge(1, lifecycle="history")})
    store.shard(0).publish({"motion/ema": {"count": 1, "sum": 2.0}, "obs/norm": {"count": 10, "sum": 5.0}})
    store.shard(0, resume={"motion/ema"}).publish(
        {"motion/ema": {"count": 1, "sum": 2.5}, "obs/norm": {"count": 1, "sum": 1.0}}
    )
    fleet = store.fleet().keys
    assert scalar(fleet["motion/ema"].parts()["sum"]) == 2.5
    assert scalar(fleet["obs/norm"].parts()["count"]) == 11  # not resumed: the old life retired, the new one added


def _sampler_fleet(url, shard_id: int, sampler: AdaptiveMotionSampler, run: str) -> Syncer:
    return new_syncer(redisync.connect(url, run=run), shard_id, [sampler], publish_every_steps=1).start()


@pytest.mark.parametrize("frames", [FRAMES, (FRAMES, 149)], ids=["one-motion", "two-motions"])
@pytest.mark.parametrize("resume", [False, True])
def test_a_restarted_pooled_sampler_is_counted_once(backend, resume, frames):
    """The default sampler through Syncers: a checkpoint resume takes the slot over, a fresh start
    drops it — for one motion and for a grouped sampler (one flat key over the motions' bins)."""
    from ..conftest import backend_url

    url, run = backend_url(backend), f"life-{backend}-{resume}-{time.time_ns()}"
    store = redisync.connect(url, run=run)
    try:
        first = AdaptiveMotionSampler(frames, 0.02)
        ema = torch.zeros(first.bin_count)
        ema[19] = 2.0
        first.bin_failed_count.copy_(ema)
        checkpoint = first.state_dict()
        syncer = _sampler_fleet(url, 0, first, run)
        syncer.on_step()
        assert syncer.wait_synced(timeout=10)
        syncer.stop()  # the process dies; its slot is still in the store

        second = AdaptiveMotionSampler(frames, 0.02)
        if resume:
            second.load_state_dict(checkpoint)
            assert second.resumed
        syncer = _sampler_fleet(url, 0, second, run)
        syncer.on_step()
        syncer.flush()  # (the sidecar reads a shared term's report itself: flush asks it to publish now)
        assert syncer.wait_synced(timeout=10)
        syncer.at_reset_boundary()
        fleet_sum = store.fleet().keys["motion/bin_failed"].parts()["sum"]
        want = ema.numpy() if resume else np.zeros(first.bin_count)
        np.testing.assert_allclose(fleet_sum, want)  # never 2x, never a frozen copy of the old life
        np.testing.assert_allclose(second.sampling_ema().numpy(), want, atol=1e-6)
        syncer.stop()
    finally:
        store.delete()


# 2. clock skew ----------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", [0, 2])
def test_a_shard_whose_lease_lapsed_leaves_a_state_key_whichever_shard_folds(make_store, folder):
    """Liveness from the leases: a shard that stopped renewing leaves a state key's pool once its
    lease has lapsed for the grace period; the history key keeps it; the fold that notices it may
    be any live shard's, with the same result."""
    store = make_store()
    store.register(
        {"motion/ema": merge(2, lifecycle="state", lease_grace_s=1.0), "obs/norm": merge(2, lifecycle="history")}
    )
    shards = {i: store.shard(i) for i in range(3)}
    for i, client in shards.items():
        assert store.lease(i, client.incarnation, 60_000)
        client.publish({"motion/ema": {"count": 1, "sum": [i + 1.0, 1.0]}, "obs/norm": {"count": 2, "sum": [1.0, i]}})
    assert store.lease(1, shards[1].incarnation, 1)  # shard 1 died: its lease runs out in 1 ms
    time.sleep(0.1)  # well within the grace (1 s): still counted
    shards[folder].publish({"motion/ema": {"count": 1, "sum": [folder + 1.0, 1.0]}})
    assert store.fleet().keys["motion/ema"].parts()["count"] == 3
    time.sleep(1.0)  # past the grace
    shards[folder].publish(
        {"motion/ema": {"count": 1, "sum": [folder + 1.0, 1.0]}, "obs/norm": {"count": 2, "sum": [1.0, folder]}}
    )
    fleet = store.fleet().keys
    np.testing.assert_array_equal(fleet["motion/ema"].parts()["sum"], [1.0 + 3.0, 2.0])  # shards 0 and 2
    assert fleet["motion/ema"].parts()["count"] == 2
    assert fleet["obs/norm"].parts()["count"] == 6  # history: the dead shard's samples stay counted
    meta = store.redis.hgetall(store.keys.key_meta("motion/ema"))
    assert meta[b"writers"] == b"0,2"
    assert meta[b"dropped_lapsed"] == b"1"
    # a shard that never leased (the low-level API, no Syncer) is not judged by leases
    store.shard(7).publish({"motion/ema": {"count": 1, "sum": [0.0, 0.0]}})
    time.sleep(1.1)
    shards[0].publish({"motion/ema": {"count": 1, "sum": [1.0, 1.0]}})
    assert store.fleet().keys["motion/ema"].parts()["count"] == 3
    # the dead shard comes back (a new life): counted again
    back = store.shard(1)
    assert store.lease(1, back.incarnation, 60_000)
    back.publish({"motion/ema": {"count": 1, "sum": [5.0, 5.0]}})
    assert store.fleet().keys["motion/ema"].parts()["count"] == 4


def test_a_syncer_keeps_its_shard_alive_and_the_default_grace_is_a_few_leases(make_store):
    """A live Syncer renews its lease, so its state slots outlive a grace shorter than the time they run; the
    default grace is at least two leases."""
    from redisync.store.schema import DEFAULT_LEASE_GRACE_S
    from redisync.store.schema import DEFAULT_LEASE_S as LEASE_S
    from redisync.terms.numpy import FailureEma

    assert merge(2, lifecycle="state").lease_grace_s == DEFAULT_LEASE_GRACE_S >= 2 * LEASE_S
    store = make_store()
    emas = [np.zeros(2, dtype=np.float32) + i + 1 for i in range(2)]
    terms = [FailureEma(emas[i], key="motion/ema", shard_id=i, lease_grace_s=0.3) for i in range(2)]
    lease_s = 1.0  # (a short lease: the test waits past one)
    syncers = [new_syncer(store, i, [terms[i]], worker="thread", lease_s=lease_s).start() for i in range(2)]
    try:
        for s in syncers:
            s.flush()
        time.sleep(lease_s + 0.5)  # past the first lease and the grace: renewed, it never lapses
        for s in syncers:
            s.on_step()
            s.flush()
        assert wait_for(lambda: store.fleet().keys["motion/ema"].parts()["count"] == 2)  # both live shards
        assert b"dropped_lapsed" not in store.redis.hgetall(store.keys.key_meta("motion/ema"))
    finally:
        for s in syncers:
            s.stop()


def test_a_negative_zero_through_fresh_lives_is_stored_as_the_reference_stores_it(make_store):
    """Signed zeros: a history key's sum element of −0.0 through three fresh lives; the retired
    history, the aggregate and the slot have the reference fold's bytes."""
    from ..reference import ReferenceFold
    from ..support import assert_same_state, lua_state, reference_state

    schema = Schema.of({"obs/norm": merge(2, lifecycle="history")})
    store, ref = make_store(), ReferenceFold(schema)
    store.register(schema)
    payload = np.array([1.0, -0.0, 2.0])
    for _life in range(3):
        client = store.shard(0)
        assert ref.claim(0, now_us=client.incarnation) == client.incarnation
        res = client.publish({"obs/norm": {"count": 1.0, "sum": payload[1:]}})
        assert (
            ref.apply(0, client.incarnation, client.seq, {"obs/norm": payload}, res.server_time_us).status == "applied"
        )
    assert_same_state(lua_state(store), reference_state(ref), rtol=0)
    retired = lua_state(store)["keys"]["obs/norm"]["retired"]
    assert retired.tobytes() == ref.keys["obs/norm"].retired.tobytes()


def test_the_dead_letter_stream_is_capped_in_bytes_as_well_as_entries(make_store):
    """Each dead letter keeps at most dead_letter_max_bytes / dead_letter_maxlen bytes of the refused
    report (said in the entry); before, every entry kept up to max_report_bytes (a zombie's refusals
    of a 64 KiB report: ~10 MB in 4 s)."""
    from redisync.store.schema import Limits

    store = make_store()
    store.register(
        {"obs/norm": merge(64, lifecycle="history")}, Limits(dead_letter_maxlen=10, dead_letter_max_bytes=1000)
    )
    assert store.limits().dead_letter_max_bytes == 1000
    zombie = store.shard(0)
    zombie.publish({"obs/norm": {"count": 1.0, "sum": np.ones(64)}})
    store.shard(0).publish({"obs/norm": {"count": 1.0, "sum": np.ones(64)}})  # a later process claims shard 0
    for _ in range(30):
        with pytest.raises(errors.StaleIncarnation):
            zombie.publish({"obs/norm": {"count": 1.0, "sum": np.ones(64)}})  # refused by the store, dead-lettered
    letters = store.redis.xrange(store.keys.dead_letters)
    assert 10 <= len(letters) < 30  # MAXLEN ~: about the cap
    for _, fields in letters:
        ((name, payload),) = [(k, v) for k, v in fields.items() if k.startswith(b"report:")]
        assert name == b"report:obs/norm (truncated)"
        assert len(payload) == 100
    assert sum(len(v) for _, f in letters for v in f.values()) < 30 * 300  # not 30 x 520 payload bytes


def test_incarnations_come_from_the_server_not_the_host_clock(make_store, monkeypatch):
    """A restarted shard's incarnation is issued by the server: a host clock far behind cannot make it a
    zombie."""
    store = make_store()
    store.register({"obs/norm": merge(1, lifecycle="history")})
    first = store.shard(0)
    first.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    monkeypatch.setattr(time, "time_ns", lambda: 1)  # a host whose clock is far behind
    restarted = store.shard(0)
    assert restarted.incarnation > first.incarnation
    restarted.publish({"obs/norm": {"count": 2, "sum": 2.0}})  # accepted, not a zombie
    assert scalar(store.fleet().keys["obs/norm"].parts()["count"]) == 3


def test_the_later_of_two_claims_wins(make_store):
    """Of two claims of one shard id the later wins, even before it publishes: the earlier is refused as a
    stale incarnation."""
    store = make_store()
    store.register({"obs/norm": merge(1, lifecycle="history")})
    early, late = store.shard(3), store.shard(3)
    assert early.incarnation < late.incarnation  # both claimed before either published
    late.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    with pytest.raises(errors.StaleIncarnation):
        early.publish({"obs/norm": {"count": 5, "sum": 5.0}})
    # even before the later claim publishes, the earlier one is a zombie
    a, b = store.shard(4), store.shard(4)
    assert a.incarnation < b.incarnation  # both claimed: b is the later life
    with pytest.raises(errors.StaleIncarnation):
        a.publish({"obs/norm": {"count": 1, "sum": 1.0}})


def test_claims_outrank_incarnations_beyond_float_precision(make_store):
    """Claims are ordered as whole numbers beyond float64's 2^53: the next claim is exactly one above."""
    store = make_store()
    store.register({"obs/norm": merge(1, lifecycle="history")})
    old = store.shard(0, incarnation=9_007_199_254_740_993)  # 2^53 + 1, a nanosecond clock's range
    old.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    assert store.shard(0).incarnation == 9_007_199_254_740_994


# 3. cancellation and 4. overflow ----------------------------------------------------------------


def test_a_fold_that_would_overflow_is_refused_and_changes_nothing(make_store):
    """A value beyond 2¹⁰⁰⁰ (where a sum of them could overflow float64), or a fold whose fleet moments
    would overflow, is refused whole (dead-lettered as non_finite) and writes nothing; values at the
    bound sum without overflow, exactly; a later finite fold is exact."""
    store = make_store()
    store.register({"motion/ema": merge(2, lifecycle="history"), "obs/norm": merge(1, sumsq=True, lifecycle="history")})
    a, b = store.shard(0), store.shard(1, incarnation=7)
    a.publish({"motion/ema": {"count": 1, "sum": [2.0**1000, 0.0]}})
    before = state_bytes(store)
    with pytest.raises(errors.NonFiniteValue, match="beyond 2\\^1000"):
        b.publish({"motion/ema": {"count": 1, "sum": [1e308, 0.0]}})
    assert state_bytes(store) == before
    assert store.dead_letters(1)[0]["reason"] == "non_finite"
    b.publish({"motion/ema": {"count": 1, "sum": [2.0**1000, 0.0]}})
    assert store.fleet().keys["motion/ema"].parts()["sum"][0] == 2.0**1001
    with pytest.raises(errors.NonFiniteValue, match="moments"):  # sumsq / count beyond float64
        b.publish({"obs/norm": {"count": 1e-10, "sum": 0.0, "sumsq": 1e300}})
    a.publish({"motion/ema": {"count": 1, "sum": [1.0, 0.0]}})  # small again: everything finite and exact
    b.publish({"motion/ema": {"count": 1, "sum": [2.0, 0.0]}})
    view = store.fleet().keys["motion/ema"]
    assert view.parts()["sum"][0] == 3.0
    assert np.isfinite(view.moments()[0]).all()


def test_a_float32_sampler_survives_a_fleet_value_beyond_its_range(make_store):
    """A float32 sampler applying a fleet value beyond float32's range keeps finite probabilities that sum to
    one and samples inside the motion, in both modes."""
    store = make_store()
    sampler = AdaptiveMotionSampler(FRAMES, 0.02, dtype=torch.float32)
    store.register(Schema.of(sampler.schema_entries()))
    store.shard(1).publish({"motion/bin_failed": {"count": 1, "sum": [1e300] + [0.0] * 19}})
    shard = store.shard(0)
    sampler.apply_shard_state(shard.pull())
    starts = sampler.sample(256)
    p = sampler.probabilities()
    assert torch.isfinite(p).all()
    assert abs(float(p.sum()) - 1) < 1e-5
    assert float(p[0]) > 0.99
    assert ((starts >= 0) & (starts < FRAMES)).all()
    weighted = AdaptiveMotionSampler(FRAMES, 0.02, mode="weighted", key="motion/w")
    store2 = make_store()
    store2.register(Schema.of(weighted.schema_entries()))
    store2.shard(1).publish({"motion/w": {"count": 1, "sum": [1e300] + [0.0] * 19}})
    weighted.apply_shard_state(store2.shard(0).pull())
    assert torch.isfinite(weighted.bin_failed_count).all()
    assert torch.isfinite(weighted.sample(16).float()).all()


def test_a_float32_normaliser_survives_fleet_moments_beyond_its_range(make_store):
    """A float32 normaliser applying fleet moments finite only in float64 keeps a finite mean, std and output."""
    store = make_store()
    norm = SyncedEmpiricalNormalization(1)
    store.register(Schema.of(norm.schema_entries()))
    store.shard(1).publish({"obs/norm": {"count": 1, "sum": [1e100], "sumsq": [1e250]}})  # finite in float64 only
    norm.apply_shard_state(store.shard(0).pull())
    out = norm(torch.tensor([[1.0]]))
    assert torch.isfinite(norm._mean).all()
    assert torch.isfinite(norm._std).all()
    assert torch.isfinite(out).all()


# 5. all-or-nothing folds ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        "slot of the wrong length",
        "missing data hash",
        "retired of the wrong length",
        "data hash of the wrong type",
        "writers not ascending",
        "writers with a non-id",
        "writers with a leading zero",
    ],
)
def test_a_fold_over_corrupt_state_writes_nothing(make_store, damage):
    """A fold that finds what it reads of a key's stored state damaged (the slot it replaces, the
    retired history it adds to, the data hash, the writers) is refused and dead-lettered, and writes
    nothing else, not even the key before it. (A fold reads its own slot and the history, not the
    other shards' slots: a slot it does not read is checked where it is read, by its shard's next
    fold, a restore, or inspect.)"""
    store = make_store()
    store.register({"a/first": merge(2, lifecycle="history"), "b/second": merge(2, lifecycle="history")})
    other = store.shard(1)
    other.publish({"a/first": {"count": 1, "sum": [1.0, 1.0]}, "b/second": {"count": 1, "sum": [1.0, 1.0]}})
    data = store.keys.key_data("b/second")
    if damage == "slot of the wrong length":
        store.redis.hset(data, "slot:1", b"\0" * 12)
    elif damage == "missing data hash":  # evicted, or lost in a partial restore
        store.redis.delete(data)
    elif damage == "retired of the wrong length":
        store.redis.hset(data, "retired", b"\0" * 8)
    elif damage == "writers not ascending":
        store.redis.hset(store.keys.key_meta("b/second"), "writers", "1,0")
    elif damage == "writers with a non-id":
        store.redis.hset(store.keys.key_meta("b/second"), "writers", "1,2x")
    elif damage == "writers with a leading zero":  # (the fold writes ids as their decimal names)
        store.redis.hset(store.keys.key_meta("b/second"), "writers", "01")
    else:
        store.redis.delete(data)
        store.redis.set(data, "not a hash")
    # (a new life of shard 1 reads its previous slot and retires it into the history)
    shard = store.shard(
        1 if damage in ("slot of the wrong length", "retired of the wrong length") else 0, incarnation=2**62
    )
    before = run_contents(store)
    with pytest.raises(errors.CorruptState, match="b/second") as refused:
        shard.publish({"a/first": {"count": 1, "sum": [2.0, 2.0]}, "b/second": {"count": 1, "sum": [2.0, 2.0]}})
    if damage.startswith("writers"):
        assert "writers holds" in str(refused.value)
    after = run_contents(store)
    dead = after.pop(store.keys.dead_letters.encode())
    assert dead is not None
    assert {k: v for k, v in before.items() if k != store.keys.dead_letters.encode()} == after


@pytest.mark.parametrize("which", ["reports", "key meta"])
def test_a_fold_into_a_key_of_the_wrong_type_is_refused_with_nothing_written(make_store, which):
    """The fold reads and writes without TYPE calls: a key of another type must still be refused
    before the first write (the reports stream's XADD is that first write)."""
    store = make_store()
    store.register({"a/first": merge(2, lifecycle="history")})
    store.shard(1).publish({"a/first": {"count": 1, "sum": [1.0, 1.0]}})
    target = store.keys.reports if which == "reports" else store.keys.key_meta("a/first")
    store.redis.delete(target)
    store.redis.rpush(target, "not a stream or hash")
    shard = store.shard(0, incarnation=store.claim(0))
    before = run_contents(store)
    with pytest.raises(errors.CorruptState, match="is a list, not a"):
        shard.publish({"a/first": {"count": 1, "sum": [2.0, 2.0]}})
    after = run_contents(store)
    after.pop(store.keys.dead_letters.encode(), None)
    before.pop(store.keys.dead_letters.encode(), None)
    assert before == after


# 6. restore -------------------------------------------------------------------------------------


def _bad_snapshots(snap):
    import base64

    def with_field(hash_name, field, raw):
        hashes = {n: dict(h) for n, h in snap.hashes.items()}
        if raw is None:
            hashes[hash_name].pop(field)
        else:
            hashes[hash_name][field] = base64.b64encode(raw).decode()
        return snap.model_copy(update={"hashes": hashes})

    yield "wrong length", with_field("data:obs/norm", "agg", b"\0" * 16)
    yield "non-finite", with_field("data:obs/norm", "slot:0", np.array([1.0, np.inf, 0.0]).tobytes())
    yield "writers without a slot", with_field("data:obs/norm", "slot:0", None)
    yield (
        "missing key hash",
        snap.model_copy(update={"hashes": {n: h for n, h in snap.hashes.items() if n != "key:obs/norm"}}),
    )
    yield "missing meta field", with_field("meta", "fleet_version", None)


def test_restore_validates_everything_before_writing(make_store):
    """Every way a snapshot can be corrupt is refused before anything is written: the run's state stays byte
    for byte."""
    store = make_store()
    store.register({"obs/norm": merge(2, lifecycle="history"), "c/scale": broadcast(())})
    store.shard(0).publish({"obs/norm": {"count": 2, "sum": [1.0, 2.0]}, "c/scale": {"value": 0.5}})
    snap = store.snapshot()
    store.shard(1).publish({"obs/norm": {"count": 3, "sum": [1.0, 1.0]}})
    before = state_bytes(store)
    for what, bad in _bad_snapshots(snap):
        with pytest.raises(errors.CorruptSnapshot):
            store.restore(bad)
        assert state_bytes(store) == before, what


def test_restore_verifies_or_remakes_every_key_field_the_fold_trusts(make_store):
    """A snapshot's writers, lifecycle and owner were trusted: reordered writers made every later fold
    refused as corrupt, a history key marked state lost counts at the next fresh restart, an emptied
    owner let a non-owner write. Now the writers are re-made from the slots and the declared fields
    must be the schema's (the field named)."""
    import base64

    store = make_store()
    store.register({"obs/norm": merge(2, lifecycle="history"), "c/scale": broadcast((), owner=0)})
    for shard in (2, 10):
        store.shard(shard).publish({"obs/norm": {"count": 100, "sum": [1.0, 2.0]}})
    store.shard(0).publish({"c/scale": {"value": 0.5}})
    snap = store.snapshot()

    def edited(key: str, field: str, value: str):
        bad = snap.model_copy(deep=True)
        bad.hashes[key][field] = base64.b64encode(value.encode()).decode()
        return bad

    for key, field, value in (("key:obs/norm", "lifecycle", "state"), ("key:c/scale", "owner", "")):
        with pytest.raises(errors.CorruptSnapshot, match=f"{field} is '{value}', the snapshot's schema declares"):
            store.restore(edited(key, field, value))
    store.restore(edited("key:obs/norm", "writers", "10,2"))  # the same ids out of order: re-made
    assert store.redis.hget(store.keys.key_meta("obs/norm"), "writers") == b"2,10"
    store.shard(5).publish({"obs/norm": {"count": 5, "sum": [1.0, 1.0]}})  # folds go on
    assert store.fleet().keys["obs/norm"].parts()["count"] == 205


def test_restore_is_atomic_with_a_fold_racing_it(make_store):
    """A fold landing just before a restore is either before it or after it: the restore opens a new epoch
    above it, and the live collector publishes on."""
    store = make_store()
    store.register({"obs/norm": merge(2, lifecycle="history")})
    racer = store.shard(1)
    racer.publish({"obs/norm": {"count": 1, "sum": [1.0, 1.0]}})
    snap = store.snapshot()
    seen = []
    call = store._call

    def injected(script, keys, args):  # a fold lands right before the restore runs
        if script is store.scripts.restore:
            seen.append(racer.publish({"obs/norm": {"count": 5, "sum": [2.0, 2.0]}}).fleet_version)
        return call(script, keys, args)

    store._call = injected
    store.restore(snap)
    store._call = call
    after = racer.pull()
    assert after.epoch_changed
    assert after.fleet_version > seen[0]
    racer.publish({"obs/norm": {"count": 6, "sum": [2.0, 2.0]}})  # the live collector keeps publishing
    assert scalar(store.fleet().keys["obs/norm"].parts()["count"]) == 6


def test_restore_into_another_run_keeps_its_live_collectors(make_store):
    """A snapshot restored into a run with a live collector of the same shard id is that collector's previous
    life: history retired and counted, state dropped."""
    source, target = make_store(), make_store()
    schema = Schema.of({"obs/norm": merge(1, lifecycle="history"), "ema/x": merge(1, lifecycle="state")})
    source.register(schema)
    target.register(schema)
    source.shard(0, incarnation=10**17).publish(
        {"obs/norm": {"count": 7, "sum": 7.0}, "ema/x": {"count": 1, "sum": 3.0}}
    )
    live = target.shard(0)
    live.publish({"obs/norm": {"count": 1, "sum": 1.0}, "ema/x": {"count": 1, "sum": 1.0}})
    target.restore(source.snapshot())
    # the snapshot's shard 0 is another incarnation: a previous life to the live collector
    live.publish({"obs/norm": {"count": 2, "sum": 2.0}, "ema/x": {"count": 1, "sum": 0.5}})
    fleet = target.fleet().keys
    assert scalar(fleet["obs/norm"].parts()["count"]) == 7 + 2  # history retired
    assert scalar(fleet["ema/x"].parts()["sum"]) == 0.5  # state dropped


# 7. lost writes ---------------------------------------------------------------------------------


def lose_tail(store, saved: dict) -> None:
    """What a crash that lost the tail of the append-only file leaves: the keys as they were, on a
    new server process (the run's ``server`` field names another process than the current one)."""
    for k in list(store.redis.scan_iter(match=store.keys.pattern)):
        store.redis.delete(k)
    for k, v in saved.items():
        store.redis.restore(k, 0, v, replace=True)
    store.redis.hset(store.keys.meta, "server", "previous-process")


def test_after_lost_writes_no_version_names_two_states(make_store):
    """After a crash lost the tail of the writes, a new epoch opens, so no (epoch, version) names two states,
    and a client that saw the lost state takes the new one."""
    store = make_store()
    store.register({"obs/norm": merge(1, lifecycle="history")})
    a, b, c = store.shard(0), store.shard(1), store.shard(2)
    a.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    b.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    saved = {k: store.redis.dump(k) for k in store.redis.scan_iter(match=store.keys.pattern)}
    lost = a.publish({"obs/norm": {"count": 10, "sum": 10.0}})  # folded, seen, then lost
    seen = a.pull()
    lose_tail(store, saved)
    folded = b.publish({"obs/norm": {"count": 2, "sum": 2.0}})  # another client folds first
    assert folded.epoch != seen.epoch  # a new server process opens a new epoch
    assert (folded.epoch, folded.fleet_version) != (seen.epoch, seen.fleet_version)
    again = a.pull()  # the client that saw the lost state takes the new one
    assert again is not None
    assert again.epoch_changed
    assert scalar(again.keys["obs/norm"].parts()["count"]) == 3
    a.publish({"obs/norm": {"count": 11, "sum": 11.0}})  # and its re-publish restores its slot
    c.publish({"obs/norm": {"count": 1, "sum": 1.0}})
    assert scalar(store.fleet().keys["obs/norm"].parts()["count"]) == 11 + 2 + 1
    assert lost.fleet_version == 3


# 8. the Syncer tells the truth ------------------------------------------------------------------


class _NormTerm:
    def __init__(self, key="obs/n", size=2):
        self.key, self.size, self.count, self.fleet = key, size, 0.0, None

    def schema_entries(self):
        return {self.key: merge(self.size, lifecycle="history")}

    def report_shard_state(self):
        self.count += 1
        return {self.key: {"count": self.count, "sum": np.full(self.size, self.count)}}

    def apply_shard_state(self, fleet):
        view = fleet.keys.get(self.key)
        if view is not None and view.value is not None:
            self.fleet = scalar(view.parts()["count"])


def test_a_failing_publish_never_stops_the_pulls(make_store, caplog):
    """A publish the store keeps refusing (out of memory) is counted and logged, and the worker still pulls
    the fleet for the collector."""
    store = make_store()
    term = _NormTerm()
    # the thread worker: the test replaces its shard client's publish in this process
    syncer = new_syncer(
        store, 0, [term], worker="thread", publish_every_steps=1, poll_every_s=0.05, retry_every_s=0.05
    ).start()

    def out_of_memory(reports):
        raise redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")

    syncer.shard.publish = out_of_memory
    with caplog.at_level(logging.ERROR, logger="redisync.collector.syncer"):
        other = store.shard(1)
        for i in range(5):
            syncer.on_step()
            other.publish({"obs/n": {"count": i + 1, "sum": [1.0, 1.0]}})
            time.sleep(0.1)
        # (not `at_reset_boundary() or ...`: that stopped at the first state applied, 4 on a loaded machine)
        assert wait_for(lambda: (syncer.at_reset_boundary(), term.fleet)[1] == 5.0)  # the view follows the store

        assert syncer.health()["ok"] is False
        assert "OOM" in syncer.health()["error"]
        assert syncer.metrics()["redisync/healthy"] == 0.0
    syncer.stop(flush=False, timeout=1)
    assert sum("OOM" in r.getMessage() for r in caplog.records) == 1  # logged once, not per retry


def test_a_schema_mismatch_is_raised_by_start_and_shown_later(make_store, caplog):
    """A schema mismatch is raised by start(); one that appears later (the run registered anew with another
    schema) is shown by health() and the log."""
    store = make_store()
    store.register({"obs/n": merge(3, lifecycle="history")})
    with pytest.raises(errors.SchemaMismatch, match="obs/n"):
        new_syncer(store, 0, [_NormTerm()]).start()
    store.delete()
    syncer = new_syncer(
        store, 0, [_NormTerm()], worker="thread", publish_every_steps=1, poll_every_s=0.05, retry_every_s=0.05
    ).start()  # the thread worker: caplog sees its log records
    syncer.on_step()
    assert syncer.wait_synced(timeout=10)
    store.delete()  # the store restarts, and another trainer registers the run first
    redisync.connect(None if store.url == "embedded" else store.url, run=store.run).register(
        {"obs/n": merge(30, lifecycle="history")}
    )
    with caplog.at_level(logging.ERROR, logger="redisync.collector.syncer"):
        for _ in range(5):
            syncer.on_step()
            time.sleep(0.1)
        assert wait_for(lambda: syncer.metrics()["redisync/schema_mismatch"] == 1.0)
        time.sleep(0.3)
    assert "obs/n" in syncer.health()["schema_mismatch"]
    assert sum("mismatch" in r.getMessage() for r in caplog.records) == 1
    syncer.stop(flush=False, timeout=1)


def test_stop_returns_within_its_timeout_against_an_unresponsive_server():
    """stop() returns within its timeout against a server that accepts and never answers, not after
    the socket's (the bound is half the socket timeout: a loaded machine is slow, never 15 s slow)."""
    silent = SilentServer()
    store = redisync.connect(silent.url, run="silent", socket_timeout=30)
    syncer = new_syncer(store, 0, [_NormTerm()], worker="thread", incarnation=1)
    syncer.worker._threads = [
        threading.Thread(target=syncer.worker._work, daemon=True),
        threading.Thread(target=syncer.worker._listen, daemon=True),
    ]
    for t in syncer.worker._threads:
        t.start()
    syncer.on_step()
    time.sleep(0.2)
    t0 = time.monotonic()
    syncer.stop(timeout=1)
    assert time.monotonic() - t0 < 30 / 2
    silent.close()


def test_a_shard_client_shared_by_threads_never_rolls_back(make_store):
    """A shard client shared by four publishing threads serialises its folds: every sequence number used once,
    none refused."""
    store = make_store()
    store.register({"obs/n": merge(1, lifecycle="history")})
    shard = store.shard(0)
    failures = []

    def publish_many():
        for i in range(50):
            try:
                shard.publish({"obs/n": {"count": i, "sum": 0.0}})
            except errors.RedisyncError as e:
                failures.append(e)

    threads = [threading.Thread(target=publish_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert shard.seq == 200


# 9. reports for runs that do not exist ----------------------------------------------------------


def test_a_report_for_an_unknown_run_creates_no_key(make_store):
    """A fold for a run that is not registered is refused and creates no key of that run."""
    store = make_store()
    store.register({"obs/n": merge(1, lifecycle="history")})
    ghost = redisync.connect(None if store.url == "embedded" else store.url, run=store.run + "-ghost")
    ghost._adopt(store.schema)
    with pytest.raises(errors.RunNotFound):  # straight to the script, as a client that skips its checks
        ghost.shard(0, incarnation=5).publish_payloads({"obs/n": np.array([1.0, 1.0]).tobytes()}, seq=1)
    assert list(ghost.redis.scan_iter(match=ghost.keys.pattern)) == []


def test_the_fold_accepts_exactly_the_run_names_the_client_accepts(make_store):
    """The fold refuses a meta key whose run name the client would refuse (a space, 129 characters, a slash)."""
    store = make_store()
    store.register({"obs/n": merge(1, lifecycle="history")})
    from redisync.store.codec import parse_publish

    for forged in ("redisync:{a b}:meta", "redisync:{" + "x" * 129 + "}:meta", "redisync:{a/b}:meta"):
        reply = store.scripts.fold(keys=[forged], args=["x"])
        with pytest.raises(errors.MalformedReport, match="not a redisync meta key"):
            parse_publish(reply, [])
