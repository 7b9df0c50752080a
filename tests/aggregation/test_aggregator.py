"""A run split into sub-runs is one fleet: the root is the exact sum of every collector's last report,
every sub-run holds the same, and restarts and a lost sub-run count nothing twice and lose nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redisync
from redisync import broadcast, errors, maximum, merge, minimum
from redisync.aggregation import OUTSIDE_SHARD, ROOT_SHARD_BASE, Aggregator, split
from redisync.store.schema import Schema

from ..support import wait_for

SCHEMA = Schema.of(
    {
        "obs/norm": merge(3, sumsq=True, lifecycle="history"),
        "motion/ema": merge(4, lifecycle="state"),
        "terrain/level": maximum(2),
        "safety/limit": minimum(1),
        "penalty/scale": broadcast(1, owner=4),
    }
)
SUBRUNS = 3


@pytest.fixture
def root(make_store):
    """A split run of three sub-runs (deleted afterwards with its sub-runs)."""
    store = make_store()
    names = split(store, SUBRUNS)
    for name in names:
        make_store(name)
    return store


def report(k: int, round_: int) -> dict:
    """Collector ``k``'s cumulative report at ``round_``: whole numbers, so every sum is exact."""
    rng = np.random.default_rng(1000 * round_ + k)
    out = {
        "obs/norm": {
            "count": float(rng.integers(1, 50)),
            "sum": rng.integers(-9, 9, 3) * 1.0,
            "sumsq": rng.integers(0, 99, 3) * 1.0,
        },
        "motion/ema": {"count": 1.0, "sum": rng.integers(0, 5, 4) * 0.25},
        "terrain/level": {"value": rng.integers(0, 10, 2) * 1.0},
        "safety/limit": {"value": [float(rng.integers(1, 100))]},
    }
    if k == 4:
        out["penalty/scale"] = {"value": [0.5 + round_]}
    return out


def exact(reports: dict[int, dict], earlier: tuple[dict[int, dict], ...] = ()) -> dict:
    """What an unsplit run of the same collectors holds, by the semantics' own definitions (a maximum
    and a minimum over every value reported in the run, ``earlier`` rounds' included)."""
    rs = list(reports.values())
    every = rs + [r for e in earlier for r in e.values()]
    return {
        "obs/norm": {p: sum(np.asarray(r["obs/norm"][p], float) for r in rs) for p in ("count", "sum", "sumsq")},
        "motion/ema": {p: sum(np.asarray(r["motion/ema"][p], float) for r in rs) for p in ("count", "sum")},
        "terrain/level": {"value": np.max([r["terrain/level"]["value"] for r in every], axis=0)},
        "safety/limit": {"value": np.min([r["safety/limit"]["value"] for r in every], axis=0)},
        "penalty/scale": {"value": np.asarray(reports[4]["penalty/scale"]["value"], float)},
    }


def collectors(root, ids=range(8)) -> dict[int, redisync.store.client.ShardClient]:
    out = {}
    for k in ids:
        home = root.home(k)
        home.register(SCHEMA)
        out[k] = home.shard(k)
    return out


def publish_round(shards: dict, round_: int) -> dict[int, dict]:
    """Every collector publishes its cumulative report of ``round_``; the reports, by collector."""
    reports = {k: report(k, round_) for k in shards}
    for k, shard in shards.items():
        shard.publish(reports[k])
    return reports


def rounds(aggregators, n: int = 2) -> None:
    for _ in range(n):
        for a in aggregators:
            a.step()


def state(store) -> dict:
    return {name: view.parts() for name, view in store.fleet().keys.items()}


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for name, parts in want.items():
        for part, value in parts.items():
            np.testing.assert_array_equal(
                np.asarray(got[name][part]).ravel(), np.asarray(value).ravel(), err_msg=f"{name}.{part}"
            )


def test_the_root_and_every_sub_run_hold_the_exact_fleet(root):
    """Eight collectors over three sub-runs: after the aggregators' rounds the root, and every sub-run
    a collector pulls, equal the unsplit run bit for bit (sums of whole numbers, extrema, the owner's
    value), and each collector's own substitution gives it the same; again after every report changed."""
    shards = collectors(root)
    aggregators = [Aggregator(root, j) for j in range(SUBRUNS)]
    earlier: tuple[dict, ...] = ()
    for round_ in (1, 2):
        reports = {k: report(k, round_) for k in shards}
        for k, shard in shards.items():
            shard.publish(reports[k])
        rounds(aggregators)
        want = exact(reports, earlier)
        earlier += (reports,)
        assert_same(state(root), want)
        for k, shard in shards.items():
            assert_same(state(root.home(k)), want)
            shard.pull(check_first=False)
            view = shard.known.keys["obs/norm"].view(reports[k]["obs/norm"])
            np.testing.assert_array_equal(view["count"], want["obs/norm"]["count"])
    assert root.shard_ids() == {ROOT_SHARD_BASE + j for j in range(SUBRUNS)} | {4}  # (4: the owner forwarded)
    assert OUTSIDE_SHARD in root.home(0).shard_ids()


@pytest.mark.parametrize(
    ("backend", "worker"),
    [("embedded", "thread"), ("real", "thread"), ("real", "process")],  # (a sidecar reaches no embedded store)
)
def test_a_syncer_of_a_split_run_publishes_to_its_shards_sub_run(root, worker):
    """A collector given only the run's URL and name publishes to sub-run ``shard % m`` and applies the
    whole fleet, the other sub-runs' collectors included, at its reset boundary, with either worker
    (a sidecar publishes to the sub-run its collector found)."""

    class Count:
        key = "obs/n"

        def __init__(self, n: float):
            self.n, self.fleet = n, None

        def schema_entries(self):
            return {self.key: merge(1, lifecycle="history")}

        def report_shard_state(self):
            return {self.key: {"count": self.n, "sum": [self.n]}}

        def apply_shard_state(self, fleet):
            view = fleet.keys.get(self.key)
            if view is not None and view.value is not None:
                self.fleet = float(view.parts()["count"])

    terms = {k: Count(10.0**k) for k in range(3)}
    syncers = {
        k: redisync.new_syncer(root.sibling(root.run), k, [t], worker=worker, publish_every_s=0.05).start()
        for k, t in terms.items()
    }
    try:
        names = root.subruns()
        assert wait_for(lambda: all(k in root.sibling(names[k]).shard_ids() for k in terms))
        assert root.shard_ids() == set()  # nothing of a collector in the root itself
        aggregators = [Aggregator(root, j, period_s=0.05) for j in range(SUBRUNS)]

        def all_see_the_fleet():
            rounds(aggregators, 1)
            for s in syncers.values():
                s.on_step()  # (a report falls due after publish_every_s)
                s.at_reset_boundary()
            return all(t.fleet == 111.0 for t in terms.values())

        assert wait_for(all_see_the_fleet, timeout=20), ({k: t.fleet for k, t in terms.items()}, state(root))
    finally:
        for s in syncers.values():
            s.stop()


def test_a_restarted_aggregator_takes_its_slots_over(root):
    """A new aggregator process for a sub-run (a new incarnation of its shards) replaces its
    predecessor's slots: a history key's root count stays the sum, not twice a sub-run's share."""
    shards = collectors(root)
    reports = {k: report(k, 1) for k in shards}
    for k, shard in shards.items():
        shard.publish(reports[k])
    first = [Aggregator(root, j) for j in range(SUBRUNS)]
    rounds(first)
    for a in first:
        a.release()  # a clean stop gives its shards up
    rounds([Aggregator(root, j) for j in range(SUBRUNS)])  # every aggregator restarted
    assert_same(state(root), exact(reports))
    assert_same(state(root.home(1)), exact(reports))


def test_a_sub_run_lost_by_its_store_leaves_no_dip_in_the_root(root):
    """Sub-run 1's store loses it (an empty node after a failover): while its collectors re-seed it,
    its aggregator keeps the last whole contribution, so the root never shows a partial sub-run; once
    every collector has re-published, the root is exact again. Without the hold it dips."""
    shards = collectors(root)
    reports = {k: report(k, 1) for k in shards}
    for k, shard in shards.items():
        shard.publish(reports[k])
    aggregators = [Aggregator(root, j) for j in range(SUBRUNS)]
    rounds(aggregators)
    want = exact(reports)
    before = float(state(root)["obs/norm"]["count"])
    lost = root.home(1)
    members = [k for k in shards if k % SUBRUNS == 1]
    assert len(members) >= 2
    lost.delete()
    rounds(aggregators, 1)  # the aggregator registers the sub-run again: a new epoch, nothing in it yet
    assert float(state(root)["obs/norm"]["count"]) == before
    shards[members[0]].publish(reports[members[0]])
    rounds(aggregators, 1)
    assert float(state(root)["obs/norm"]["count"]) == before  # one of its collectors back: still held
    for k in members[1:]:
        shards[k].publish(reports[k])
    rounds(aggregators)
    assert_same(state(root), want)

    for a in aggregators:
        a.release()  # (stopped: their successors without the hold claim their shards)
    unheld = [Aggregator(root, j, reseed_s=0.0) for j in range(SUBRUNS)]
    rounds(unheld)
    lost.delete()
    rounds(unheld, 1)
    shards[members[0]].publish(reports[members[0]])
    rounds(unheld, 1)
    assert float(state(root)["obs/norm"]["count"]) < before  # the dip the hold prevents


def test_a_split_is_made_once_before_the_collectors_start(make_store):
    """A split is idempotent (the split in force is returned), refused on a run already registered
    unsplit, and an aggregator of a run that is not split, or of a sub-run it lacks, is refused."""
    store = make_store()
    names = split(store, 2)
    assert store.split(["other.0", "other.1", "other.2"]) == names
    assert store.home(3).run == names[1]
    with pytest.raises(errors.ConfigurationError, match="no sub-run 2"):
        Aggregator(store, 2)
    plain = make_store()
    plain.register(SCHEMA)
    with pytest.raises(errors.ConfigurationError, match="registered already"):
        split(plain, 2)
    with pytest.raises(errors.ConfigurationError, match="not split"):
        Aggregator(plain, 0)
    assert plain.home(5) is plain
    with pytest.raises(errors.InvalidSchema):
        make_store().split(["bad name"])


def test_the_aggregate_command_runs_every_sub_runs_aggregator_until_terminated(real_url):
    """``redisync aggregate --subruns 2`` splits the run and aggregates it until SIGTERM, exit 0."""
    root = redisync.connect(real_url, run=f"t-{uuid.uuid4().hex[:12]}")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redisync.cli",
            "aggregate",
            "--url",
            real_url,
            "--run",
            root.run,
            "--subruns",
            "2",
            "--period",
            "0.05",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: len(root.subruns()) == 2)
        shards = collectors(root, ids=range(6))
        reports = {k: report(k, 1) for k in shards}
        for k, shard in shards.items():
            shard.publish(reports[k])
        want = float(exact(reports)["obs/norm"]["count"])

        def exact_everywhere():
            try:
                return all(float(state(s)["obs/norm"]["count"]) == want for s in (root, root.home(0), root.home(1)))
            except errors.RunNotFound:
                return False

        assert wait_for(exact_everywhere, timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        for name in root.subruns():
            root.sibling(name).delete()
        root.delete()
    assert proc.returncode == 0, err
    assert "as 2 sub-runs" in err


def test_an_aggregator_goes_on_after_a_refused_round(root):
    """A round the store refuses (here a schema mismatch, as after the run was registered anew) is
    logged and tried again next period: the aggregator's thread does not end on it."""
    collectors(root, ids=range(3))
    aggregator = Aggregator(root, 0, period_s=0.01)
    real_step, calls, done = aggregator.step, [], []

    def step():
        calls.append(1)
        if len(calls) == 1:
            raise errors.SchemaMismatch("obs/norm", "registered anew with another shape")
        return real_step()

    aggregator.step = step
    stop = threading.Event()
    thread = threading.Thread(target=aggregator.run, args=(stop, done.append))
    thread.start()
    try:
        assert wait_for(lambda: len(done) >= 2)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert len(calls) >= 3  # the refused round, then rounds that went through


def test_a_root_lost_by_its_store_comes_back_exact_at_the_next_round(root):
    """The root's store loses it (deleted, or its server restarted empty) while the aggregators run:
    the next round registers and splits it again before anything is published up, and the root holds
    the exact fleet again (was: every later round raised RunNotFound at the up-publish, for good)."""
    shards = collectors(root)
    reports = publish_round(shards, 1)
    aggregators = [Aggregator(root, j) for j in range(SUBRUNS)]
    rounds(aggregators)
    assert_same(state(root), exact(reports))
    root.delete()  # (the sub-runs stay: another slot, another primary)
    rounds(aggregators)
    assert root.subruns() == aggregators[0].names
    assert_same(state(root), exact(reports))
    later = publish_round(shards, 2)
    rounds(aggregators)
    assert_same(state(root), exact(later, (reports,)))


def test_a_second_aggregator_of_a_sub_run_is_refused_and_the_first_goes_on(root):
    """While sub-run 0's aggregator holds its shards, a second one for it is refused (ShardInUse) at
    its first round and takes nothing over; the first goes on and the root stays exact (was: the
    second silently took the shards, and once it stopped the first was fenced out for good)."""
    shards = collectors(root)
    reports = publish_round(shards, 1)
    aggregators = [Aggregator(root, j) for j in range(SUBRUNS)]
    rounds(aggregators)
    second = Aggregator(root, 0)
    with pytest.raises(errors.ShardInUse):
        second.step()
    later = publish_round(shards, 2)
    rounds(aggregators)
    assert_same(state(root), exact(later, (reports,)))


def test_an_aggregator_fenced_out_by_another_stops_with_an_error(root):
    """Another process claims sub-run 0's root shard over its aggregator (take_over): the aggregator's
    loop ends with Fenced instead of retrying refused rounds for ever."""
    collectors(root, ids=range(3))
    aggregator = Aggregator(root, 0, period_s=0.01, lease_s=0.05)
    aggregator.step()
    root.claim(ROOT_SHARD_BASE, take_over=True)  # a later process's claim of its shard
    stop = threading.Event()
    timer = threading.Timer(20, stop.set)  # (a loop that retried for ever would end here, without the error)
    timer.start()
    try:
        with pytest.raises(errors.Fenced):
            aggregator.run(stop)
    finally:
        timer.cancel()
    assert not stop.is_set()


def test_a_second_aggregate_command_for_a_run_exits_non_zero_saying_why(real_url):
    """`redisync aggregate` for a run whose sub-runs another aggregator holds exits 1 and says so."""
    root = redisync.connect(real_url, run=f"t-{uuid.uuid4().hex[:12]}")
    names = split(root, 2)
    collectors(root, ids=range(2))
    first = [Aggregator(root, j, period_s=0.05) for j in range(2)]
    stop = threading.Event()
    running = [threading.Thread(target=a.run, args=(stop,), daemon=True) for a in first]  # (live: they renew)
    try:
        for thread in running:
            thread.start()
        assert wait_for(lambda: all(a.rounds > 0 for a in first), timeout=30)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "redisync.cli",
                "aggregate",
                "--url",
                real_url,
                "--run",
                root.run,
                "--period",
                "0.05",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 1, proc.stderr
        assert "is held by a live process" in proc.stderr
        assert "waiting for that lease to run out" in proc.stderr  # (then refused: its holder renewed it)
    finally:
        stop.set()
        for thread in running:
            thread.join(30)
        for name in names:
            root.sibling(name).delete()
        root.delete()


def test_two_aggregators_started_together_leave_exactly_one(root, monkeypatch):
    """The interleaving A, B, B, A of their claims (A claims the root shard, B claims it and the
    sub-run's, A claims the sub-run's, then each leases): with leases taken only after both claims,
    each held one of the other's shards and both were fenced out (the root stopped at 0.0 where one run
    held 1.0). Now each claim is leased at once: B goes on, A stops."""
    shards = collectors(root)
    reports = publish_round(shards, 1)
    first, second = Aggregator(root, 0), Aggregator(root, 0)
    others = [Aggregator(root, j) for j in range(1, SUBRUNS)]
    rounds(others)  # (the root registered by the other sub-runs' aggregators)
    _ = first.up.incarnation  # A's first claim, as its round begins
    renew = second._renew_leases
    refused: list[BaseException] = []

    def a_claims_in_between() -> None:  # A's second claim, after B's two and before B leases
        try:
            _ = first.down.incarnation
        except errors.RedisyncError as e:
            refused.append(e)
        renew()

    monkeypatch.setattr(second, "_renew_leases", a_claims_in_between)
    second.step()
    monkeypatch.setattr(second, "_renew_leases", renew)
    with pytest.raises((errors.Fenced, errors.ShardInUse)):
        first.step()
    rounds([second, *others])
    rounds([second, *others])
    assert_same(state(root), exact(reports))


def test_an_aggregator_restarted_inside_its_crashed_predecessors_lease_waits_for_it(root, caplog):
    """A supervisor restarts a crashed aggregator at once: its claims meet the dead one's lease. It
    exited with ShardInUse (a crash loop); it now waits as long as that lease has left, saying so,
    and then aggregates."""
    shards = collectors(root)
    reports = publish_round(shards, 1)
    crashed = Aggregator(root, 0, lease_s=1.0)
    others = [Aggregator(root, j) for j in range(1, SUBRUNS)]
    rounds([crashed, *others])  # then it dies: no release, its lease runs on
    restarted = Aggregator(root, 0, period_s=0.05)
    stop = threading.Event()
    thread = threading.Thread(target=restarted.run, args=(stop,), daemon=True)
    with caplog.at_level("WARNING", logger="redisync.aggregation"):
        thread.start()
        try:
            assert wait_for(lambda: restarted.rounds >= 2, timeout=30), "the restarted aggregator never aggregated"
            rounds(others)
            assert_same(state(root), exact(reports))
        finally:
            stop.set()
            thread.join(30)
    assert "waiting for that lease to run out" in caplog.text


WIDE = Schema.of({"x/sum": merge(2, lifecycle="state"), "x/moments": merge(1, sumsq=True, lifecycle="history")})


def _split_and_unsplit(make_store, values: dict[int, list[float]]):
    """The same collectors' reports (shard k: ``values[k]``) to a run split in three and to one
    unsplit run; the split run's aggregators rounded to a standstill. Returns (root, unsplit)."""
    root = make_store()
    for name in split(root, SUBRUNS):
        make_store(name).register(WIDE)  # (every sub-run, whether a collector of these lands there or not)
    whole = make_store()
    whole.register(WIDE)
    for k, v in values.items():
        home = root.home(k)
        home.register(WIDE)
        rep = {
            "x/sum": {"count": 1.0, "sum": [v[0], v[1]]},
            # (moments whose mean squared stays finite: the fleet moments of 2^1000 would overflow in any run)
            "x/moments": {"count": float(k + 1), "sum": [v[0] * 1e-160], "sumsq": [abs(v[1]) * 1e-160]},
        }
        home.shard(k).publish(rep)
        whole.shard(k).publish(rep)
    aggregators = [Aggregator(root, j) for j in range(SUBRUNS)]
    rounds(aggregators, 3)
    return root, whole


def _values(store, name: str) -> np.ndarray:
    return np.asarray(store.fleet().keys[name].value)


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ({0: [1.0, 0.0], 3: [-1e300, 0.0], 1: [1e300, 0.0]}, 1.0),  # 1.0 and -1e300 in sub-run 0, 1e300 in 1
        ({0: [0.1, 0.0], 1: [0.2, 0.0], 2: [-0.3, 0.0]}, 2.7755575615628914e-17),  # the correctly rounded sum
        ({0: [2.0**1000, 0.0], 3: [2.0**1000, 0.0], 1: [1.0, 0.0]}, 2.0**1001),  # two shards at 2^1000 in one sub-run
    ],
)
def test_a_split_runs_value_is_the_unsplit_runs_where_rounding_and_range_bite(make_store, values, want):
    """The cases where forwarding each sub-run's rounded value lost the sum (the root held 0.0 for
    1.0, 5.55e-17 for 2.78e-17) or refused it (a sub-run's 2^1001 is beyond one slot's 2^1000): the
    root and every sub-run now hold the unsplit run's value, bit for bit."""
    root, whole = _split_and_unsplit(make_store, values)
    assert _values(whole, "x/sum")[1] == want  # (count, sum₀, sum₁)
    for store in (root, *(root.sibling(n) for n in root.subruns())):
        for name in WIDE.keys:
            np.testing.assert_array_equal(_values(store, name), _values(whole, name), err_msg=f"{store.run} {name}")


WIDE_FLOATS = st.one_of(
    st.floats(min_value=-(2.0**1000), max_value=2.0**1000, allow_nan=False, allow_infinity=False),
    st.sampled_from([2.0**1000, -(2.0**1000), 1e300, -1e300, 5e-324, -5e-324, 1e-300, 0.1, 0.2, -0.3, 0.0, -0.0]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    values=st.dictionaries(st.integers(0, 11), st.lists(WIDE_FLOATS, min_size=2, max_size=2), min_size=1, max_size=8)
)
def test_a_split_run_equals_the_unsplit_run_bit_for_bit_over_wide_range_values(make_store, values):
    """Any shards' values of any magnitude a run accepts (subnormals, ±2^1000, cancelling pairs), over
    three sub-runs: the root and every sub-run hold what one unsplit run of the same reports holds, bit
    for bit, for a state key and a history key with sums of squares."""
    root, whole = _split_and_unsplit(make_store, values)
    for store in (root, *(root.sibling(n) for n in root.subruns())):
        for name in WIDE.keys:
            np.testing.assert_array_equal(_values(store, name), _values(whole, name), err_msg=f"{store.run} {name}")
