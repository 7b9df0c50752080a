"""The outbox's codec: a report is checked and encoded once, by the collector, and reaches the
store as it was encoded."""

from __future__ import annotations

import numpy as np
import pytest

from redisync import errors
from redisync.collector.mailbox import OUTBOX, Mailbox
from redisync.collector.report_codec import ReportCodec
from redisync.collector.sidecar import _slot_bytes
from redisync.store import schema as schema_module
from redisync.store.schema import Encoded, Limits, Schema, broadcast, encode_reports, maximum, merge

SCHEMA = Schema.of(
    {"obs/norm": merge(3, sumsq=True, lifecycle="history"), "cmd/level": maximum(()), "stage/id": broadcast(2)}
)
REPORTS = {
    "obs/norm": {"count": 4.0, "sum": np.array([1.0, -2.0, 3.0]), "sumsq": np.array([1.0, 4.0, 9.0])},
    "cmd/level": {"value": 2.5},
    "stage/id": {"value": [7.0, 8.0]},
}


def test_the_payloads_cross_the_mailbox_bit_for_bit():
    """What the sidecar reads from the outbox is the collector's encoding, byte for byte, marked as encoded."""
    payloads = encode_reports(SCHEMA, REPORTS, Limits())
    codec = ReportCodec(SCHEMA)
    box = Mailbox.create(_slot_bytes(SCHEMA, 1), _slot_bytes(SCHEMA, 2))
    try:
        box.write_vectors(OUTBOX, codec.encode(payloads))
        got = box.read_vectors(OUTBOX, 0)
        assert got is not None
        decoded = codec.decode(got[1])
    finally:
        box.close()
    assert decoded == payloads
    assert all(type(p) is Encoded for p in decoded.values())


def test_an_encoded_payload_is_not_checked_and_encoded_again(monkeypatch):
    """The sidecar's publish passes the collector's payloads through (the models' check never runs),
    and still refuses one of the wrong length."""
    payloads = {name: Encoded(p) for name, p in encode_reports(SCHEMA, REPORTS, Limits()).items()}

    def again(*args, **kwargs):
        raise AssertionError("a payload encoded by the collector was checked and encoded again")

    monkeypatch.setattr(schema_module, "coerce_report", again)
    monkeypatch.setattr(schema_module, "_plain_payload", again)
    assert encode_reports(SCHEMA, payloads, Limits()) == payloads
    with pytest.raises(errors.ShapeMismatch, match="needs 56"):
        encode_reports(SCHEMA, {"obs/norm": Encoded(bytes(16))}, Limits())
