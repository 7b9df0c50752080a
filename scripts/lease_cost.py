"""What the lease check costs a fold, in instructions: one merge key of 64 values folded with 1, 4
and 16 live slots, as a history key and as a state key whose writers all hold a fresh lease (as live
Syncers keep them), on a redis-server of its own under callgrind (``redisync.bench.instructions``).
Run it on two checkouts side by side: ``PYTHONPATH=<checkout> python scripts/lease_cost.py``."""

import json
import sys
import uuid

import numpy as np

import redisync
from redisync.bench.instructions import KEY, CountingServer, measure
from redisync.store.client import connect
from redisync.store.schema import Schema, merge

print("redisync from", redisync.__file__, file=sys.stderr)


def measure_state(server, n, slots, folds):
    store = connect(server.url, run=f"cg-{uuid.uuid4().hex[:8]}", socket_timeout=600)
    try:
        store.register(Schema.of({KEY: merge(n, lifecycle="state")}))
        rng = np.random.default_rng(n + slots)
        shards = [store.shard(i) for i in range(slots)]
        for i, shard in enumerate(shards):
            shard.publish({KEY: {"count": 1.0, "sum": rng.random(n)}})
            store.lease(i, shard.incarnation, 600_000)  # every shard alive, as Syncers keep them
        reports = [{KEY: {"count": 1.0, "sum": rng.random(n)}} for k in range(folds)]
        it = iter(reports)
        return server.count(lambda: shards[0].publish(next(it)), folds)
    finally:
        store.delete()


server = CountingServer()
try:
    out = {}
    for slots in (1, 4, 16):
        out[f"history 64 values, {slots} slots"] = measure(server, 64, slots, 200)
        out[f"state 64 values, {slots} slots"] = measure_state(server, 64, slots, 200)
    print(json.dumps(out))
finally:
    server.close()
