"""Where a fold's instructions go: the server's count of a fold cut short at each stage of it.

A fold runs fold.lua (the envelope), lifecycle.lua (who has left a key with slots) and, for a merge
key, semantics/merge.lua. Each stage is a copy of the three that returns just before one of their landmarks (a line found by its text, so the script
follows the Lua as it changes); a stage's cost is the difference between two
consecutive cuts. Counted as ``redisync bench --instructions`` counts (a redis-server of its own under
callgrind, request handling only), on the same workload: one merge key of N values, every slot live,
folds by shard 0, averaged over enough folds to include Lua's garbage-collector steps (four times the
benchmark's: where a collection step lands moves a stage by a few thousand). The FCALL
is sent directly (the client would read a cut reply as an error), with the arguments ``publish()``
sends.

    python scripts/fold_stages.py [--values 64] [--slots 1] [--folds N] [--lua path/to/lua] [--whole]

(``--lua``: another version's Lua folder, e.g. ``git archive <commit> redisync/store/lua | tar -x``, to
set a change beside the one before it; ``--whole``: the whole fold only, no stages.)
"""

from __future__ import annotations

import argparse
import itertools
import uuid
from pathlib import Path

import numpy as np

from redisync.bench.instructions import KEY, CountingServer, folds_for
from redisync.store import library
from redisync.store.client import connect
from redisync.store.library import Library
from redisync.store.schema import Schema, merge

# (the line a cut comes before, what the stage that ends there does), in the order a fold runs them
# (a cut inside a semantics' check returns its {'cut'} as the check's rejection, which the fold returns)
LANDMARKS = (
    ("run = run_keys(KEYS[1])", "FCALL envelope: the arguments, the keys and args tables, the call"),
    ("-- the envelope ---", "the run's meta (HMGET of 8 fields)"),
    ("-- duplicates, retries and zombies", "envelope checks (KEYS, schema digest, ids and seq)"),
    ("local total = 0", "the shard's incarnation and seq (HMGET), duplicate check"),
    ("local t = redis.call('TIME')", "payload size"),
    ("epoch = meta[1]", "TIME and the restart check (the server's identity)"),
    ("if module.slots then LIFECYCLE.judge(", "the key's declaration and state (HMGET) and shape"),
    ("local bad = module.check(", "the life cycle: who has left (lifecycle.lua, the indexes since the last look)"),
    ("local whole = width * 8", "merge: its declaration checked, the live slots taken from the judgement"),
    ("local stored, why = planes(", "merge: the reads (one HMGET) and the history a new life retires"),
    ("item.agg = result[1]", "the exact sum: each value checked, three two-sums per value and slot changed"),
    ("-- apply ---", "the rest of the key's check"),
    ("local versions = {}", "the stream entry (XADD)"),
    ("local trail = ''", "the writes (HSETs of data, key meta, run meta, shards)"),
    (None, "SPUBLISH (or the window's bookkeeping) and the reply"),
)


# the files a fold runs, by their path under lua/
FILES = ("fold.lua", "lifecycle.lua", "semantics/merge.lua")


def cut_before(sources: dict[str, str], landmark: str | None) -> dict[str, str]:
    """The fold's files with the one that holds ``landmark`` returning {'cut'} just before the one
    line that starts (indentation aside) with it."""
    if landmark is None:
        return dict(sources)
    at = [
        (path, i)
        for path, text in sources.items()
        for i, line in enumerate(text.split("\n"))
        if line.lstrip().startswith(landmark)
    ]
    if len(at) != 1:
        raise SystemExit(f"the fold's Lua has {len(at)} lines starting with {landmark!r}: update LANDMARKS")
    path, i = at[0]
    lines = sources[path].split("\n")
    return dict(sources) | {path: "\n".join([*lines[:i], "do return {'cut'} end", *lines[i:]])}


def cut_library(client, landmark: str | None, sources: dict[str, str], n: int) -> Library:
    """The library with the fold cut before ``landmark``, loaded under a name of its own."""
    library = Library(client, name=f"redisync_cut{n}", version="cut", edit=cut_before(sources, landmark))
    library.load()
    return library


def fold_sources(folder: Path | None = None) -> dict[str, str]:
    """The fold's files, from ``folder`` (another version's lua/) or the package's."""
    read = (lambda p: (folder / p).read_text()) if folder else (lambda p: library._LUA.joinpath(p).read_text())
    return {path: read(path) for path in FILES}


def captured_fold(store, values: int, slots: int) -> tuple[list, list]:
    """The KEYS and ARGV of a fold by shard 0 of one merge key with ``slots`` live slots, as
    ``publish()`` sends them (the store's run registered and every slot written first)."""
    store.register(Schema.of({KEY: merge(values, lifecycle="history")}))
    rng = np.random.default_rng(values + slots)
    shards = [store.shard(i) for i in range(slots)]
    for shard in shards:
        shard.publish({KEY: {"count": 1.0, "sum": rng.random(values)}})
    sent: dict = {}
    call = store._call
    store._call = lambda script, keys, args: sent.update(keys=keys, args=list(args)) or call(script, keys, args)
    shards[0].publish({KEY: {"count": 2.0, "sum": rng.random(values)}})
    store._call = call
    return sent["keys"], sent["args"]


def stage_costs(
    values: int, slots: int, folds: int, source: dict[str, str], landmarks: tuple = LANDMARKS
) -> list[tuple[str, float]]:
    server = CountingServer()
    out, before = [], 0.0
    try:
        for landmark, what in landmarks:
            store = connect(server.url, run=f"stages-{uuid.uuid4().hex[:8]}", socket_timeout=600)
            keys, args = captured_fold(store, values, slots)
            script = cut_library(store.redis, landmark, source, len(out)).fold
            seq = int(args[3])
            script(keys=keys, args=[*args[:3], seq + 1, *args[4:]])  # loaded before counting

            seqs = itertools.count(seq + 2)

            def fold(script=script, keys=keys, args=args, seqs=seqs) -> None:
                script(keys=keys, args=[*args[:3], next(seqs), *args[4:]])

            total = server.count(fold, folds)
            out.append((what, total - before))
            before = total
            script.library.unload()
            store.delete()
    finally:
        server.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--values", type=int, default=64)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--folds", type=int, default=None, help="folds averaged per stage (4 x the benchmark's)")
    parser.add_argument("--lua", default=None, help="the lua/ folder to cut (the package's by default)")
    parser.add_argument("--whole", action="store_true", help="the whole fold only, no stages")
    a = parser.parse_args()
    source = fold_sources(Path(a.lua) if a.lua else None)
    landmarks = ((None, "the whole fold"),) if a.whole else LANDMARKS
    costs = stage_costs(a.values, a.slots, a.folds or 4 * folds_for(a.values), source, landmarks)
    print(f"instructions per fold by stage, {a.values} values, {a.slots} slot(s) live, shard 0 folding")
    for what, n in costs:
        print(f"{n:>10,.0f}  {what}")
    if len(costs) > 1:
        print(f"{sum(n for _, n in costs):>10,.0f}  the whole fold")


if __name__ == "__main__":
    main()
