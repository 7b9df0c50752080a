"""A model-based test of a fleet's life: hypothesis drives the events a real fleet lives through.

Rules: publish (a failure EMA, normaliser moments, a histogram, an owned scale and a
level any shard may raise), duplicate, crash, fresh restart, resume from a checkpoint, restart on a host whose
clock is behind, a zombie of an earlier life, leases renewed, run out and given up (a clean stop), a server stall
longer than every lease, stale slots, a store restart without persistence, a
crash that loses the tail of the append-only file, restores into the same and into another run, and a
fold racing a restore. The model is the reference fold (``tests/reference.py``) plus, per shard, the
process that lives there and the cumulative statistics it would report. After every step, on fakeredis
and on the real Redis: the store equals the model; every aggregate is within the exactness bound of
the live slots; every live process' slot holds its latest report (nothing counted twice, nothing
lost); no client sees a version go back within an epoch and no (epoch, version) names two states;
everything stored is finite; a refused operation changed nothing.
"""

from __future__ import annotations

import copy
import math
import time
import uuid
from dataclasses import dataclass, field

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

import redisync
from redisync import errors
from redisync.store.codec import encode
from redisync.store.schema import Limits, MaximumSpec, MergeSpec, Schema, broadcast, maximum, merge

from ..conftest import backend_url, examples
from ..reference import ReferenceFold
from ..support import assert_same_state, lua_state, reference_state, run_contents

SCHEMA = Schema.of(
    {
        # a failure EMA: a fresh restart drops the old slot, a shard whose lease lapsed leaves the pool
        "motion/ema": merge(3, lifecycle="state", lease_grace_s=0.05),
        "obs/norm": merge(
            2, sumsq=True, lifecycle="history"
        ),  # normaliser moments: history, retired on a fresh restart
        "terrain/hist": merge(2, stale_after_s=0.05, lifecycle="state"),  # dead shards drop out
        # normaliser moments whose departed shards' slots are retired 50 ms after their lease ended
        "obs/retiring": merge(2, lifecycle="history", retire_after_s=0.05),
        "curriculum/scale": broadcast((), owner=0),
        # a level any shard may raise: a fresh restart reports from 0 again, which lowers nothing
        "command/range": maximum(2),
    }
)
# a gap of more than 20 ms between the run's calls is a stall: leases run out in served time only
LIMITS = Limits(stall_after_s=0.02)
NAMES = list(SCHEMA.keys)
SHARD_IDS = (0, 5, 40)  # the fold's sums: two sub-groups of one group (ids 0-15), and another group (32-47)
MAGNITUDES = st.sampled_from([1e-3, 1.0, 1e3, 1e16, 1e300])


@dataclass
class Process:
    """One collector process of a shard: its store client and the cumulative statistics it reports."""

    client: redisync.ShardClient
    own: dict[str, np.ndarray] = field(default_factory=dict)  # per key, the latest report (cumulative)
    last: tuple[int, dict[str, np.ndarray]] | None = None  # the last applied (seq, payloads), to duplicate
    alive: bool = True


def exact_within_bound(spec: MergeSpec, agg: np.ndarray, vectors: list[np.ndarray]) -> bool:
    """``|agg − fsum(vectors)| ≤ 1e-12·Σ|vectors| + a subnormal floor``, element by element."""
    for j in range(spec.width):
        column = [float(v[j]) for v in vectors]
        exact = math.fsum(column)
        if abs(agg[j] - exact) > 1e-12 * math.fsum(abs(x) for x in column) + 1e-300:
            return False
    return True


class FleetLife(RuleBasedStateMachine):
    backend = "embedded"

    @initialize()
    def start(self) -> None:
        self.url = backend_url(self.backend)
        self.store = redisync.connect(self.url, run=f"life-{uuid.uuid4().hex[:10]}")
        self.scratch = redisync.connect(self.url, run=f"life-{uuid.uuid4().hex[:10]}")
        self.store.register(SCHEMA, LIMITS)
        self.ref = ReferenceFold(SCHEMA, LIMITS)
        self.procs: dict[int, Process] = {}
        self.zombies: dict[int, Process] = {}
        self.states: dict[tuple[str, int], str] = {}  # (epoch, version) -> what the store held
        self.seen: dict[int, tuple[str, int]] = {}  # per process client: the newest (epoch, version) pulled
        self.saved: tuple[dict, ReferenceFold, dict] | None = None  # an earlier moment, for tail loss and restores
        self.levels: dict[str, np.ndarray] = {}  # per maximum key, every level folded since the store began
        for shard in SHARD_IDS:
            self._spawn(shard, resume=False)

    def teardown(self) -> None:
        for store in (getattr(self, "store", None), getattr(self, "scratch", None)):
            if store is not None:
                store.delete()

    # ------------------------------------------------------------------ helpers

    def _spawn(self, shard: int, resume: bool, clock_behind: bool = False) -> None:
        before = self.procs.get(shard)
        if clock_behind:
            real = time.time_ns
            time.time_ns = lambda: 1  # a host whose clock is far behind: never asked for an incarnation
        try:
            client = self.store.shard(shard, resume=resume)
            inc = client.incarnation
        finally:
            if clock_behind:
                time.time_ns = real
        assert self.ref.claim(shard, now_us=inc) == inc
        proc = Process(client)
        if resume and before is not None:
            proc.own = copy.deepcopy(before.own)  # the checkpoint: the previous life's latest reports
        if before is not None and before.alive:
            self.zombies[shard] = before
        self.procs[shard] = proc

    def _report(self, proc: Process, name: str, scale: float, seed: int) -> np.ndarray:
        """The process' next cumulative report of ``name``: its previous one plus what it saw since."""
        spec = SCHEMA.keys[name]
        rng = np.random.default_rng(seed)
        if isinstance(spec, MergeSpec):
            if spec.stale_after_s is not None or spec.lease_grace_s is not None:
                scale = min(scale, 1e16)  # a refusal would depend on the fold's server time (which slots are live)
            parts = [rng.uniform(0, scale, spec.count_size), rng.normal(0, scale, spec.size)]
            grow = np.concatenate(parts + ([rng.uniform(0, scale, spec.size)] if spec.sumsq else []))
            if spec.lifecycle == "state":  # a current state moves freely (an EMA decays)
                return grow
            return proc.own.get(name, np.zeros(spec.width)) + grow  # history only accumulates
        if isinstance(spec, MaximumSpec):  # a level that only goes up, in steps of its own
            return proc.own.get(name, np.zeros(spec.width)) + rng.integers(0, 3, spec.width) * min(scale, 1e16)
        return rng.normal(0, scale, spec.width)

    def _fold(
        self,
        proc: Process,
        shard: int,
        payloads: dict[str, np.ndarray],
        seq: int | None = None,
        incarnation: int | None = None,
    ) -> str:
        """Publish through the real client and the model alike; both must agree on the outcome."""
        client = proc.client
        encoded = {n: encode([p]) for n, p in payloads.items()}
        own_inc = client.incarnation
        if seq is None:
            client.seq += 1
            seq = client.seq
        floor = client.highest_version
        if incarnation is not None:
            client.incarnation = incarnation
        try:
            res = client.publish_payloads(encoded, seq)
            got, reason, now = res.status, None, res.server_time_us or 0
        except errors.InvalidReport as e:
            got, reason, now = "rejected", e.reason, 0
        finally:
            client.incarnation = own_inc
        resume = {n for n in payloads if client.resumes(n)}
        want = self.ref.apply(shard, incarnation or own_inc, seq, payloads, now, floor=floor, resume=resume)
        assert (got, reason) == (want.status, want.reason)
        if got == "applied":
            proc.own.update({n: p.copy() for n, p in payloads.items()})
            proc.last = (seq, payloads)
            for n, p in payloads.items():
                if isinstance(SCHEMA.keys[n], MaximumSpec):  # an oracle of its own: numpy's maximum
                    self.levels[n] = p.copy() if n not in self.levels else np.maximum(self.levels[n], p)
        return got

    def _republish_all(self) -> None:
        """What every live Syncer does on a new epoch: re-publish its latest cumulative reports."""
        for shard, proc in sorted(self.procs.items()):
            if proc.alive and proc.own:
                self._fold(proc, shard, {n: p for n, p in proc.own.items() if shard == 0 or n != "curriculum/scale"})

    def _raw(self) -> dict:
        return {k: self.store.redis.dump(k) for k in self.store.redis.scan_iter(match=self.store.keys.pattern)}

    def _contents(self) -> dict:
        return run_contents(self.store)

    # ------------------------------------------------------------------ rules: the events of a fleet's life

    @rule(
        shard=st.sampled_from(SHARD_IDS),
        keys=st.sets(st.sampled_from(NAMES), min_size=1),
        scale=MAGNITUDES,
        seed=st.integers(0, 2**16),
    )
    def publish(self, shard, keys, scale, seed):
        proc = self.procs[shard]
        if not proc.alive:  # a crashed shard's reports come from its next process
            self._spawn(shard, resume=False)
            proc = self.procs[shard]
        if shard != 0:
            keys = keys - {"curriculum/scale"} or {"obs/norm"}
        self._fold(proc, shard, {n: self._report(proc, n, scale, seed) for n in sorted(keys)})

    # reports are most of a fleet's life: two more ways in to the same rule weigh it accordingly
    publish_again = rule(
        shard=st.sampled_from(SHARD_IDS),
        keys=st.sets(st.sampled_from(NAMES), min_size=1),
        scale=MAGNITUDES,
        seed=st.integers(0, 2**16),
    )(lambda self, **kw: self.publish(**kw))
    publish_more = rule(
        shard=st.sampled_from(SHARD_IDS),
        keys=st.sets(st.sampled_from(NAMES), min_size=1),
        scale=MAGNITUDES,
        seed=st.integers(0, 2**16),
    )(lambda self, **kw: self.publish(**kw))

    @rule(shard=st.sampled_from(SHARD_IDS))
    def duplicate(self, shard):
        proc = self.procs[shard]
        if proc.alive and proc.last is not None:  # a retry whose reply was lost: folded once
            seq, payloads = proc.last
            self._fold(proc, shard, payloads, seq=seq)

    @rule(shard=st.sampled_from(SHARD_IDS))
    def crash(self, shard):
        self.procs[shard].alive = False  # its slot stays; nothing more comes from it

    @rule(shard=st.sampled_from(SHARD_IDS), resume=st.booleans(), clock_behind=st.booleans())
    def restart(self, shard, resume, clock_behind):
        self._spawn(shard, resume=resume, clock_behind=clock_behind)

    @rule(shard=st.sampled_from(SHARD_IDS), lease_ms=st.sampled_from([0, 1, 50, 60_000]), zombie=st.booleans())
    def lease(self, shard, lease_ms, zombie):
        """A live Syncer renews its shard's lease (60 s, or 50 ms: shorter than a stall), lets it run
        out (1 ms: it died just after, or its sidecar was paused) or gives it up at stop (0: it leaves
        motion/ema at the next fold); a zombie's renewal is refused. The folds after a lease has lapsed
        for longer than motion/ema's grace (see ``stale``) leave that shard's slot out, unless the
        shard folded since (it lived on, for a grace past that fold)."""
        proc = self.zombies.get(shard) if zombie else self.procs[shard]
        if proc is None or not proc.alive:
            return
        inc = proc.client.incarnation
        got = self.store.lease(shard, inc, lease_ms)
        until = self.store.redis.hget(self.store.keys.shards, f"{shard}:lease_until_us")
        want = self.ref.lease(shard, inc, int(until) - 1000 * lease_ms if got else 0, lease_ms)
        assert got == want

    @rule(shard=st.sampled_from(SHARD_IDS), seed=st.integers(0, 2**16))
    def zombie(self, shard, seed):
        """The previous process of a restarted shard is still running and publishes."""
        old = self.zombies.get(shard)
        if old is None:
            return
        before = self._contents()
        if self._fold(old, shard, {"obs/norm": self._report(old, "obs/norm", 1.0, seed)}) == "rejected":
            after = self._contents()
            for raw in (before, after):
                raw.pop(self.store.keys.dead_letters.encode(), None)
            assert after == before  # a refused operation changes nothing

    @rule()
    def stale(self):
        # terrain/hist slots not refreshed since, and motion/ema slots of shards whose lease lapsed
        # before, drop out at the next fold of that key
        time.sleep(0.06)

    @rule(seed=st.integers(0, 2**16))
    def server_stall(self, seed):
        """The server serves nothing for 200 ms, longer than a 50 ms lease and its grace (a stall, a
        paused VM, a clock step): at the first fold after it, no shard whose lease was running in the
        run's served clock leaves motion/ema."""
        before = set(lua_state(self.store)["keys"]["motion/ema"]["slots"])
        now = self.ref.clock_wall - self.ref.clock_stalled if self.ref.clock_wall is not None else 0
        running = {s for s, u in self.ref.alive.items() if u >= now}
        time.sleep(0.2)
        live = [s for s, p in self.procs.items() if p.alive]
        if not live:
            return
        self.publish(live[0], {"motion/ema"}, 1.0, seed)
        after = set(lua_state(self.store)["keys"]["motion/ema"]["slots"])
        assert (before & running) <= after, (before, running, after)

    @rule()
    def save_moment(self):
        self.saved = (self._raw(), copy.deepcopy(self.ref), copy.deepcopy(self.levels))

    @rule()
    def store_restart_without_persistence(self):
        self.store.delete()
        self.store.register(SCHEMA, LIMITS)
        self.ref = ReferenceFold(SCHEMA, LIMITS)
        self.saved = None
        self.levels = {}
        self._republish_all()  # the collectors' latest levels re-seed the maximum

    @precondition(lambda self: self.saved is not None)
    @rule()
    def aof_tail_loss(self):
        raw, ref, levels = self.saved
        for k in list(self.store.redis.scan_iter(match=self.store.keys.pattern)):
            self.store.redis.delete(k)
        for k, v in raw.items():
            self.store.redis.restore(k, 0, v, replace=True)
        self.store.redis.hset(self.store.keys.meta, "server", "a-process-that-crashed")
        self.ref = copy.deepcopy(ref)
        self.levels = copy.deepcopy(levels)
        self._republish_all()  # the first fold opens a new epoch; every Syncer then re-publishes

    @precondition(lambda self: self.saved is not None)
    @rule(race=st.booleans())
    def restore_same_run(self, race):
        raw, ref, levels = self.saved
        snap = self._snapshot_of(raw)
        if race:  # a fold lands between the snapshot being read and the restore
            live = [s for s, p in self.procs.items() if p.alive and s != 0]
            if live:
                self.publish(live[0], {"obs/norm"}, 1.0, 7)
        self.store.restore(snap)
        self.ref.restore(ref)
        self.levels = copy.deepcopy(levels)
        self._republish_all()

    @rule()
    def restore_into_another_run(self):
        self.scratch.delete()
        self.scratch.register(SCHEMA, LIMITS)
        scratch_ref = ReferenceFold(SCHEMA, LIMITS)
        self.scratch.restore(self.store.snapshot())
        scratch_ref.restore(self.ref)
        assert_same_state(lua_state(self.scratch), reference_state(scratch_ref), rtol=0)

    def _snapshot_of(self, raw: dict):
        """The snapshot of an earlier moment: its keys restored into the scratch run's namespace."""
        self.scratch.delete()
        prefix_from, prefix_to = self.store.keys.prefix.encode(), self.scratch.keys.prefix.encode()
        for k, v in raw.items():
            self.scratch.redis.restore(k.replace(prefix_from, prefix_to), 0, v, replace=True)
        snap = self.scratch.snapshot()
        self.scratch.delete()
        return snap

    # ------------------------------------------------------------------ invariants

    @invariant()
    def the_store_is_the_model(self):
        if hasattr(self, "store"):
            assert_same_state(lua_state(self.store), reference_state(self.ref), rtol=0)

    @invariant()
    def exact_finite_and_nothing_counted_twice_or_lost(self):
        if not hasattr(self, "store"):
            return
        state = lua_state(self.store)
        for name, key in state["keys"].items():
            spec = SCHEMA.keys[name]
            if isinstance(spec, MaximumSpec):  # the greatest of every level folded since the store last began
                want = self.levels.get(name)
                assert (key["value"] is None) == (want is None), name
                assert want is None or key["value"].tobytes() == want.tobytes(), (name, key["value"], want)
            if not isinstance(spec, MergeSpec):
                assert key["value"] is None or np.isfinite(key["value"]).all()
                continue
            vectors = (list(key["retired"]) if key["retired"] is not None else []) + [
                s[2] for s in key["slots"].values()
            ]
            assert all(np.isfinite(v).all() for v in vectors)
            assert np.isfinite(key["value"]).all()
            assert exact_within_bound(spec, key["value"], vectors), name
            for shard, proc in self.procs.items():
                slot = key["slots"].get(shard)
                if proc.alive and name in proc.own and slot is not None and slot[0] == proc.client.incarnation:
                    np.testing.assert_array_equal(slot[2], proc.own[name])  # its latest report, once

    @invariant()
    def versions_never_go_back_and_name_one_state(self):
        if not hasattr(self, "store"):
            return
        for _shard, proc in self.procs.items():
            got = proc.client.pull()
            state = proc.client.known
            if got is None or state is None:
                continue
            epoch, version = state.epoch, state.fleet_version
            digest = repr(sorted((n, None if v.value is None else v.value.tobytes()) for n, v in state.keys.items()))
            assert self.states.setdefault((epoch, version), digest) == digest, "one (epoch, version), two states"
            last = self.seen.get(id(proc.client))
            if last is not None and last[0] == epoch and not got.lost_writes:
                assert version >= last[1]
            self.seen[id(proc.client)] = (epoch, version)


LIFE_SETTINGS = settings(
    max_examples=examples(50), stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)


@pytest.mark.parametrize("backend_name", ["embedded", "real"])
def test_a_fleet_lives_through_its_life_cycle(backend_name):
    """The model-based test: collectors publish, retry, crash, restart (resuming or not, clocks behind),
    lease, turn zombie; the server stalls, restarts empty, loses its file's tail, is restored; the store
    stays the model's, exact and finite, nothing counted twice or lost, no version naming two states."""
    machine = type(f"FleetLife_{backend_name}", (FleetLife,), {"backend": backend_name})
    run_state_machine_as_test(machine, settings=LIFE_SETTINGS)
