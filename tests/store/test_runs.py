"""Run administration (`redisync.store.runs`): what a registration leaves in the run's meta."""

from __future__ import annotations

from redisync.store.schema import Limits, Schema, merge

SCHEMA = Schema.of({"obs/n": merge(1, lifecycle="history")})


def test_the_limits_are_sent_once_and_kept_as_the_fold_and_older_readers_read_them(make_store):
    """register.lua receives the limits once (``Limits.packed``) and keeps them as the fold reads them
    (``limits``) and field by field (what a reader of the separate fields, e.g. an earlier redisync's
    ``limits()``, reads): the same values either way."""
    store = make_store()
    limits = Limits(
        max_report_bytes=123_456, stream_maxlen=77, dead_letter_maxlen=9, stream_payloads=True,
        dead_letter_max_bytes=65_536, announce_every_s=0.25,
    )  # fmt: skip
    store.register(SCHEMA, limits)
    meta = store.run_info()
    assert meta["limits"] == limits.packed()
    assert (meta["max_report_bytes"], meta["stream_maxlen"], meta["dead_letter_maxlen"]) == ("123456", "77", "9")
    assert (meta["stream_payloads"], meta["dead_letter_max_bytes"]) == ("1", "65536")
    assert meta["announce_every_us"] == "250000"
    assert store.limits() == limits
    other = make_store()
    other.register(SCHEMA)
    assert "announce_every_us" not in other.run_info()  # every fold announces: no window kept
    assert other.run_info()["stream_payloads"] == "0"
