"""The mailbox between a collector and its sidecar: one writer per slot, a reader that never waits
and never keeps a torn message (a seqlock), the latest message only, and a message too large
refused with its size; the hand-over word packs an epoch's tag with a version."""

from __future__ import annotations

import numpy as np
import pytest

from redisync.collector.mailbox import Mailbox, MailboxFull, pack_handed, unpack_handed
from redisync.store.codec import epoch_tag


@pytest.fixture
def mailbox():
    box = Mailbox.create(4096, 4096)
    yield box
    box.close()


def test_a_reader_gets_the_latest_message_once_and_nothing_while_it_is_written(mailbox):
    """A written message is read once (then "nothing newer"); a later write replaces it; while the
    writer's sequence number is odd (mid-write, or a writer killed there) the reader gets None."""
    assert mailbox.read(0, 0) is None  # nothing written yet
    first = mailbox.write(0, {"a": 1})
    assert mailbox.read(0, 0) == (first, {"a": 1})
    assert mailbox.read(0, first) is None
    second = mailbox.write(0, {"a": 2})
    assert second > first
    assert second % 2 == 0
    assert mailbox.read(0, first) == (second, {"a": 2})
    mailbox.header[0] = second + 1  # a writer killed mid-write leaves the number odd
    assert mailbox.read(0, first) is None
    third = mailbox.write(0, {"a": 3})  # the next writer carries on from it
    assert mailbox.read(0, second) == (third, {"a": 3})


def test_vectors_cross_in_place_bit_for_bit_and_a_too_large_message_is_refused(mailbox):
    """Tagged float64 vectors (and scalars) are read back bit for bit, a view copied out of the slot;
    a message larger than its slot is refused naming both sizes, and the slot keeps its message."""
    values = np.array([-0.0, 5e-324, 1.5])
    seq = mailbox.write_vectors(1, [(7, values), (9, 2.5)])
    got_seq, got = mailbox.read_vectors(1, 0)
    assert got_seq == seq
    assert [tag for tag, _ in got] == [7, 9]
    assert got[0][1].tobytes() == values.tobytes()
    assert got[1][1].tolist() == [2.5]
    with pytest.raises(MailboxFull, match="does not fit its 4096-byte slot"):
        mailbox.write_vectors(1, [(1, np.zeros(600))])
    assert mailbox.read_vectors(1, 0)[0] == seq  # untouched


def test_a_second_mapping_of_the_block_sees_what_the_first_wrote():
    """The sidecar attaches the collector's block by name and reads what the collector wrote."""
    box = Mailbox.create(1024, 1024)
    try:
        other = Mailbox.attach(box.name, box.sizes)
        try:
            seq = box.write(0, ["report", 1])
            assert other.read(0, 0) == (seq, ["report", 1])
        finally:
            other.close()
    finally:
        box.close()


def test_the_hand_over_word_packs_an_epochs_tag_and_a_version():
    """0 means nothing handed yet; otherwise the epoch's tag and the version (32 bits) come back."""
    assert unpack_handed(0) is None
    assert unpack_handed(pack_handed("e1", 42)) == (epoch_tag("e1"), 42)
    assert unpack_handed(pack_handed("e1", 2**32 + 5)) == (epoch_tag("e1"), 5)
