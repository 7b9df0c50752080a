"""A broadcast key: the owner's value (or the last writer's), refused to every other shard."""

from __future__ import annotations

import numpy as np
import pytest

from redisync import errors
from redisync.store import codec

from ..test_store import SCHEMA


def test_broadcast_is_last_writer_wins_and_owned_keys_refuse_others(make_store):
    """A broadcast key holds the last accepted value; an owned key refuses every other shard, on the client
    (nothing sent, no dead letter) and on the server for a client that skips the check."""
    store = make_store()
    store.register(SCHEMA)
    a, b = store.shard(0), store.shard(1)
    a.publish({"curriculum/stage": {"value": [1.0]}})
    b.publish({"curriculum/stage": {"value": [2.0]}})
    assert store.fleet().keys["curriculum/stage"].parts()["value"].tolist() == [2.0]
    with pytest.raises(errors.NotOwner, match="owned by shard 0; this is shard 1"):
        b.publish({"curriculum/scale": {"value": 1.0}})
    assert store.dead_letters() == []
    assert b.seq == 1
    with pytest.raises(errors.NotOwner):  # and by the server, for a client that skips the check
        b.publish_payloads({"curriculum/scale": codec.encode([np.array([1.0])])}, seq=3)
    assert [d["reason"] for d in store.dead_letters()] == ["not_owner"]
    assert store.key_info("curriculum/stage")["writer"] == "1"
