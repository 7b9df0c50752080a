"""The wire format: float64 little-endian vectors laid end to end, bit for bit both ways; replies as
text without ever failing on bytes; an epoch's tag stable and 31 bits wide."""

from __future__ import annotations

import math

import numpy as np
import pytest

from redisync import errors
from redisync.store.codec import as_text, decode, encode, epoch_tag


def test_a_payload_round_trips_bit_for_bit_including_signed_zeros_and_subnormals():
    """encode then decode gives the same bits (−0.0 stays −0.0, a subnormal stays itself), little-endian
    whatever the array's own byte order or dtype."""
    values = np.array([-0.0, 0.0, 5e-324, -1.5, 2.0**1000, math.pi])
    raw = encode([values[:2], values[2:].astype(">f8")])
    assert raw == values.astype("<f8").tobytes()
    back = decode(raw, 6)
    assert back.tobytes() == values.tobytes()
    back[0] = 1.0  # writable: a copy, not a view of the reply
    assert encode([np.float32(0.5) * np.ones(2)]) == np.array([0.5, 0.5]).tobytes()


def test_a_payload_of_the_wrong_length_is_refused_with_both_lengths():
    """decode with a width refuses bytes of another length and says both."""
    with pytest.raises(errors.ShapeMismatch, match="expected 16 bytes, got 12"):
        decode(b"\0" * 12, 2)


def test_replies_become_text_without_ever_failing():
    """Bytes decode as UTF-8 with invalid bytes escaped; anything else is its str."""
    assert as_text(b"shard:1") == "shard:1"
    assert as_text(b"\xff\xfe") == "\\xff\\xfe"
    assert as_text(7) == "7"


def test_an_epochs_tag_is_stable_and_fits_31_bits():
    """The tag is the epoch's CRC-32 in 31 bits: the same for the same epoch, different for another."""
    assert epoch_tag("abc") == epoch_tag("abc") == 0x352441C2 & 0x7FFFFFFF
    assert 0 <= epoch_tag("x" * 100) < 2**31
    assert epoch_tag("abc") != epoch_tag("abd")
