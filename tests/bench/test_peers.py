"""``bench --peers`` in miniature: every kind of collector runs, and a straggler holds up the
collective's other ranks but not redisync's (a property with a 20 ms margin, not a speed target)."""

from __future__ import annotations

import pytest

from redisync.bench.peers import STRAGGLE_EVERY, STRAGGLE_S, Scenario, measure, run_peers

pytestmark = pytest.mark.integration  # starts collector processes (and gloo process groups)


def test_a_straggler_holds_up_the_collective_but_not_the_store(real_url):
    """A straggling rank holds up a gloo broadcast's other rank; a redisync collector beside a straggler
    blocks less than a third as long, and still applies fleet states."""
    gloo = measure(Scenario("gloo-broadcast", 2, straggler=True), 300, real_url)
    ours = measure(Scenario("process", 2, straggler=True), 300, real_url)
    # every 10th step the other rank waits for the straggler's 20 ms inside the broadcast
    assert gloo["mean_us"] > 0.5 * STRAGGLE_S * 1e6 / STRAGGLE_EVERY
    assert ours["mean_us"] < gloo["mean_us"] / 3
    assert len(ours["fleet_versions_applied"]) == 2
    assert min(ours["fleet_versions_applied"]) > 0


def test_the_peers_table_has_every_row_and_ratio(real_url):
    """The peers table has a row for every scenario, with its blocking time and its ratio to the others."""
    scenarios = (Scenario("gloo-allreduce", 2, 50), Scenario("thread", 2), Scenario("process", 2))
    res = run_peers(real_url, steps=200, scenarios=scenarios)
    assert [r["scenario"] for r in res["rows"]] == [
        "gloo all_reduce/50",
        "redisync thread/step",
        "redisync process/step",
    ]
    assert all(r["p99_us"] >= r["p50_us"] > 0 and r["floor_p99_us"] >= 5.0 for r in res["rows"])
    for row in res["rows"][1:]:  # redisync's steps: every one handed a report over, applied a fleet state, or neither
        shares = {kind: b["share"] for kind, b in row["breakdown"].items()}
        assert sum(shares.values()) == pytest.approx(1.0)
        assert shares["apply"] > 0
    for row in res["rows"][1:]:  # fresh states, applied a few times a second
        assert row["applies_per_s"] > 0
        assert row["applied_lag_versions_p50"] >= 0
    thread, process = res["rows"][1]["breakdown"], res["rows"][2]["breakdown"]
    assert thread["hand-over"]["share"] > 0
    assert process["hand-over"]["share"] == 0  # the sampler's report is the sidecar's to read: on_step only counts
    assert [r["scenario"] for r in res["ratios_over_redisync_process"]] == [
        "gloo all_reduce/50",
        "redisync thread/step",
    ]


def test_the_overlapped_collective_works_a_step_behind_and_each_row_says_how_fresh_it_is(real_url):
    """The fair peer of an asynchronous store: all_reduce(async_op=True), waited a step later. Its
    freshness (steps behind) and redisync's (versions behind) stand beside the latencies."""
    res = run_peers(
        real_url,
        steps=200,
        scenarios=(Scenario("gloo-allreduce-async", 2), Scenario("gloo-allreduce", 2, 50), Scenario("process", 2)),
    )
    overlapped, every50, ours = res["rows"]
    assert overlapped["scenario"] == "gloo all_reduce async/step"
    assert overlapped["behind_steps_mean"] == 1.0  # every step holds the fleet state of the step before
    assert every50["behind_steps_mean"] == pytest.approx(24.5)  # 0 to 49 steps behind, evenly
    assert overlapped["freshness"] == "1.0 steps behind"
    assert ours["freshness"].endswith("versions behind (p50)")
    assert ours["applied_lag_versions_p50"] >= 0
