"""``redisync bench --instructions``: a figure that does not move with the machine's load."""

from __future__ import annotations

import pytest

from redisync.bench.instructions import (
    CountingServer,
    floors,
    format_fleet_table,
    measure,
    run_fleet_instructions,
    run_instructions,
)

pytestmark = pytest.mark.integration  # starts a redis-server of its own, under valgrind


def test_a_folds_instruction_count_repeats_whatever_the_load():
    """A fold's instruction count under callgrind repeats within 1 %: the figure does not move with the
    machine's load."""
    server = CountingServer()
    try:
        first, second = measure(server, 256, 4, folds=50), measure(server, 256, 4, folds=50)
        floor = floors(server, 256, 2)
    finally:
        server.close()
    # within 1 % over repeats: Redis steps Lua's garbage collector once every 50 scripts, so 50 folds hold
    # one step each (over 6 the step's landing moved the figure by 3 %); the stream's trimming moves it a little
    assert abs(first - second) / first < 0.02, (first, second)
    assert floor["ping"] < floor["hset"] < floor["decode_encode"] < first  # a fold costs more than its floors


def test_the_table_has_every_size_and_slot_count_and_the_marginal_cost():
    """The instructions table has a row for every size and slot count, and the marginal cost per value between
    sizes."""
    result = run_instructions(sizes=(64, 512), slots=(1, 4), folds=2, client_publishes=200)
    assert {(r["values"], r["slots"]) for r in result["folds"]} == {(64, 1), (64, 4), (512, 1), (512, 4)}
    one, four = (m["per_value"] for m in result["marginal_per_value"])
    assert one > 0
    assert abs(four - one) / one < 0.1  # the fold adds what changed: its cost per value is not the slots'

    # the client's publish, counted apart from its probe's start: tens of thousands (84k before the
    # payload was encoded in the check), never the probe's whole run (tens of millions)
    assert 10_000 < result["client_publish_instructions_at_64"] < 150_000


def test_the_fleet_table_holds_both_kinds_of_key_at_each_slot_count_and_a_fold_that_does_not_grow():
    """The stated report's fold and pull at each slot count, for history and state keys, the cost per
    value at two slot counts and this machine's rate; the fold at 48 live slots within a tenth of the
    fold at 4 (the slots it does not read), a state key's within a tenth of a history key's."""
    result = run_fleet_instructions(slots=(4, 48), folds=4, rate_folds=20, value_slots=(4, 16))
    folds = {(r["lifecycle"], r["slots"]): r["fold"] for r in result["rows"]}
    assert set(folds) == {("history", 4), ("history", 48), ("state", 4), ("state", 48)}
    for lifecycle in ("history", "state"):
        assert folds[(lifecycle, 48)] < 1.1 * folds[(lifecycle, 4)], folds
    assert folds[("state", 48)] < 1.1 * folds[("history", 48)], folds
    assert result["rate"] > 0
    assert all(r["collectors_at_1hz"] > 0 and r["pull"] > 0 for r in result["rows"])
    assert "state / history at 48 slots" in format_fleet_table(result)
    # the reference folds on the same report: the plain fold does more than floor_add, the exact fold
    # more than either, and the table prints the ratios
    floor = result["floors"]
    assert 0 < floor["floor_add"] < floor["plain_fold"] < min(folds.values()), (floor, folds)
    assert all(r["over_plain_fold"] == r["fold"] / floor["plain_fold"] for r in result["rows"])
    assert "x floor_add" in format_fleet_table(result)
