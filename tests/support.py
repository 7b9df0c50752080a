"""Reading a run's raw state out of Redis in the shape of the reference fold, for comparison."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from redisync.store.client import Store
from redisync.store.codec import decode
from redisync.store.schema import MergeSpec
from redisync.store.semantics.merge import LAYOUT, exact_planes, planes_of

from .reference import ReferenceFold


def _s(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def run_contents(store: Store) -> dict:
    """Every key of the run by its contents (not DUMP's bytes: a read may move a hash's rehashing on,
    and with it the order DUMP writes the fields in)."""
    r, out = store.redis, {}
    for k in r.scan_iter(match=store.keys.pattern):
        kind = r.type(k)
        if kind == b"hash":
            out[k] = sorted(r.hgetall(k).items())
        elif kind == b"zset":
            out[k] = r.zrange(k, 0, -1, withscores=True)
        elif kind == b"stream":
            out[k] = r.xrange(k)
        else:
            out[k] = r.dump(k)
    return out


def lua_state(store: Store) -> dict:
    """fleet version, shards and per key: version, value, writer, slots, retired."""
    r = store.redis
    out = {
        "fleet_version": int(r.hget(store.keys.meta, "fleet_version")),
        "shards": {},
        "leases": {},
        "alive": {},
        "keys": {},
    }
    shards = {_s(k): _s(v) for k, v in r.hgetall(store.keys.shards).items()}
    for field, v in shards.items():
        sid, what = field.split(":")
        if what == "lease_until_us":
            out["leases"][int(sid)] = int(v)
        elif what == "alive_until_us":
            out["alive"][int(sid)] = int(v)
        elif what not in (
            "at_us",
            "claimed",
            "seen",
            "made",
            "stopped",
            "ended_us",
        ):  # (for the operator: when, what it
            # had seen, why it gave its lease up)
            out["shards"].setdefault(int(sid), {})[what] = int(v)
    for name, spec in store.schema.keys.items():
        meta = {_s(k): _s(v) for k, v in r.hgetall(store.keys.key_meta(name)).items()}
        data = {_s(k): v for k, v in r.hgetall(store.keys.key_data(name)).items()}
        key = {"version": int(meta["version"])}
        if isinstance(spec, MergeSpec):  # the slots, the retired history and the stored sums
            key["value"] = decode(data["agg"], spec.width)
            key["retired"] = planes_of(data["retired"], data["retired_lo"], spec.width) if "retired" in data else None
            key["slots"] = {
                int(f.split(":")[1]): (int(meta[f + ":incarnation"]), int(meta[f + ":seq"]), decode(v, spec.width))
                for f, v in data.items()
                if f.startswith("slot:")
            }
            # the stored exact sum is the canonical planes of the retired history and the live slots
            assert set(data) <= {"agg", "agg_lo", "retired", "retired_lo"} | {f"slot:{i}" for i in key["slots"]}, (
                name,
                sorted(data),
            )
            if key["slots"]:
                assert meta.get("sums_layout") == LAYOUT, (name, meta.get("sums_layout"))
                vectors = ([] if key["retired"] is None else list(key["retired"])) + [
                    s[2] for s in key["slots"].values()
                ]
                planes = planes_of(data["agg"], data["agg_lo"], spec.width)
                np.testing.assert_array_equal(planes, exact_planes(vectors, spec.width), err_msg=name)
                assert planes.tobytes() == exact_planes(vectors, spec.width).tobytes(), name  # (+0.0, not −0.0)
            writers = meta.get("writers", "")
            assert sorted(map(int, filter(None, writers.split(",")))) == sorted(key["slots"]), "writers list drifted"
        else:  # a register: its value, and its last writer where the semantics records one
            key["value"] = decode(data[spec.stored_field], spec.width) if spec.stored_field in data else None
            key["writer"] = int(meta["writer"]) if "writer" in meta else None
            assert set(data) <= {spec.stored_field}, (name, sorted(meta), sorted(data))
        out["keys"][name] = key
    return out


def reference_state(ref: ReferenceFold) -> dict:
    out = {
        "fleet_version": ref.fleet_version,
        "shards": {sid: {"incarnation": s.incarnation, "seq": s.seq} for sid, s in ref.shards.items()},
        "leases": dict(ref.leases),
        "alive": dict(ref.alive),
        "keys": {},
    }
    for name, st in ref.keys.items():
        key = {"version": st.version, "value": st.value}
        if isinstance(ref.specs[name], MergeSpec):
            key["retired"] = st.retired
            key["slots"] = {sid: (s.incarnation, s.seq, s.payload) for sid, s in st.slots.items()}
        else:
            key["writer"] = st.writer
        out["keys"][name] = key
    return out


def _close(a, b, rtol: float) -> bool:
    """Within ``rtol``; with ``rtol=0``, bit for bit (a −0.0 is not a +0.0)."""
    if a is None or b is None:
        return a is None and b is None
    if rtol == 0:
        return a.shape == b.shape and a.tobytes() == b.tobytes()
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b))))


def assert_same_state(lua: dict, ref: dict, rtol: float = 1e-12) -> None:
    """Exact for versions, shards, slots, broadcast and maximum values; ``rtol`` for merge aggregates."""
    assert lua["fleet_version"] == ref["fleet_version"]
    assert lua["shards"] == ref["shards"]
    assert lua["leases"] == ref["leases"]
    assert lua["alive"] == ref["alive"]
    for name, r in ref["keys"].items():
        l = lua["keys"][name]
        assert l["version"] == r["version"], name
        if "slots" in r:
            assert _close(l["value"], r["value"], rtol), (name, l["value"], r["value"])
            assert _close(l["retired"], r["retired"], rtol), name
            assert set(l["slots"]) == set(r["slots"]), name
            for sid, (inc, seq, payload) in r["slots"].items():
                linc, lseq, lpayload = l["slots"][sid]
                assert (linc, lseq) == (inc, seq), (name, sid)
                assert lpayload.tobytes() == payload.tobytes(), (name, sid)
        else:  # broadcast (with its writer) and maximum: the value bit for bit
            assert l.get("writer") == r.get("writer"), name
            assert _close(l["value"], r["value"], 0), name


def envelope(kind: str, client, last: dict, shard: int, payloads: dict) -> tuple[int, int, dict]:
    """The (incarnation, seq, payloads) an operation of a random sequence sends: a new report, a
    duplicate of the last applied one, a restart (new incarnation), a zombie (an older incarnation)
    or a rollback (an older seq)."""
    inc, seq = client.incarnation, client.seq + 1
    if kind == "duplicate" and shard in last:
        seq, payloads = last[shard]
    elif kind == "restart":
        client.incarnation += 7
        inc = client.incarnation
    elif kind == "zombie":
        inc = client.incarnation - 1
    elif kind == "rollback" and client.seq > 1:
        seq = client.seq - 1
    return inc, seq, payloads


def send_as(client, incarnation: int, encoded: dict, seq: int):
    """Publish as ``incarnation`` (a zombie's, possibly) without changing the client's own."""
    own = client.incarnation
    client.incarnation = incarnation
    try:
        return client.publish_payloads(encoded, seq)
    finally:
        client.incarnation = own


def sync(store, shards, terms):
    """Every shard publishes its terms' reports, then every shard pulls and applies."""
    for client, mine in zip(shards, terms, strict=False):
        reports = {}
        for term in mine:
            reports.update(term.report_shard_state())
        if reports:
            client.publish(reports)
    for client, mine in zip(shards, terms, strict=False):
        client.pull()
        for term in mine:
            term.apply_shard_state(client.known)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


@contextlib.contextmanager
def socket_calls_of_this_thread() -> Iterator[list[str]]:
    """The socket operations (connect, send, receive) this thread makes while the context lasts, by
    name: what a hot path that never touches the network makes none of, however loaded the machine."""
    calls: list[str] = []
    me = threading.get_ident()
    names = ("connect", "connect_ex", "send", "sendall", "recv", "recv_into")
    originals = {name: getattr(socket.socket, name) for name in names}

    def counted(name: str, original: Any) -> Any:
        def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me:
                calls.append(name)
            return original(self, *args, **kwargs)

        return call

    for name, original in originals.items():
        setattr(socket.socket, name, counted(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(socket.socket, name, original)
