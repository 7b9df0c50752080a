"""A term's state in shared memory: what it reports, read by the sidecar without the collector's
help, and what it receives, staged by the sidecar and taken in with one copy at a reset boundary.

**Reports.** With the process worker, a term that can keeps the buffers its reports are made of
(the sampler's own failure EMA, the normaliser's own count, Σx and Σx²) in shared memory, and goes
on updating them in place as it always did — between `SharedState.begin` and
`SharedState.end`, the two halves of a seqlock. When a publish is due, the sidecar copies
the buffers and keeps the copy only if the sequence number did not move meanwhile. The
collector's ``on_step()`` is then a counter: it never builds, encodes or copies a report.

**Fleet state.** A term that can reads the part of the fleet state it needs (everybody else's
aggregate of a merge key, a broadcast value) from an array `SharedState.receive` gave it.
The sidecar writes every new fleet state into a staging block (seqlocked); ``at_reset_boundary()``
copies the staging block into those arrays — one checked copy for all such terms — and a term
notices the new `SharedState.applied` version when it next reads. No decoding and no Python
objects per key on the collector.

A term opts in with ``share_report(shared) -> bool`` and ``share_fleet(shared) -> bool`` (see
`redisync.collector.seam`). One that does not (or cannot: a buffer on an accelerator, a report that is
not a slice of its state) stays on the copy path: its reports cross the mailbox's outbox and it
is handed decoded fleet states, as with the thread worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import InvalidSchema
from ..store.codec import PullResult
from ..store.schema import Schema
from .mailbox import Block, map_block, privatize

CONTROL_BYTES = 64  # a seqlock's sequence number and a version (int64s), alone on a cache line


@dataclass(frozen=True)
class SharedPart:
    """Where one part of a key's report lives: ``count`` elements of ``dtype`` at element
    ``offset`` of block ``block``, or a ``constant``."""

    key: str
    part: str
    block: int = -1
    dtype: str = "float64"
    offset: int = 0
    count: int = 0
    constant: float | None = None


def _create(size: int) -> tuple[Block, Any]:
    """A new block and our mapping of it, which outlives stop() (a term may write after its syncer
    stopped): the block's memory goes when the last process mapping it does."""
    block = Block(size, "redisync-state")
    return block, block.mapping


def _key_offsets(schema: Schema) -> dict[str, int]:
    """Where each key's flat vector starts in the staging block (in float64s)."""
    offsets, at = {}, 0
    for name, spec in schema.keys.items():
        offsets[name], at = at, at + spec.width
    return offsets


class SharedState:
    """The collector's side: allocates the shared buffers, counts the terms' writes to them, and
    takes staged fleet states in."""

    def __init__(self, schema: Schema):
        self.schema = schema
        self._control, control = _create(CONTROL_BYTES)
        self._seq = memoryview(control).cast("q")
        self._blocks: list[tuple[Block, NDArray[Any]]] = []
        self.parts: list[SharedPart] = []
        # the fleet: staged by the sidecar (control: seq, version), taken into `_live` at a reset boundary
        self._offsets = _key_offsets(schema)
        width = sum(spec.width for spec in schema.keys.values())
        self._staging_shm, staging = _create(CONTROL_BYTES + 8 * max(width, 1))
        self.staged = memoryview(staging).cast("q")  # seq, version: a newer seq is a state to take
        self._staging: NDArray[np.float64] = np.ndarray(
            (width,), dtype=np.float64, buffer=staging, offset=CONTROL_BYTES
        )
        self._live: NDArray[np.float64] = np.zeros(width)
        # byte views for take(): a memoryview copy runs far less code than numpy's, which shows on a cold cache
        self._staging_bytes = memoryview(staging)[CONTROL_BYTES : CONTROL_BYTES + 8 * width]
        self._scratch_bytes, self._live_bytes = memoryview(bytearray(8 * width)), memoryview(self._live.data).cast("B")
        self.received: list[str] = []
        self._on_take: list[Callable[[], None]] = []
        self.taken = 0  # the staged seq last taken
        self.applied = 0  # the fleet version the received arrays hold (0: none yet)

    # ------------------------------------------------------------------ reports

    def array(self, like: NDArray[Any]) -> NDArray[Any]:
        """A copy of ``like`` in shared memory (same shape and dtype): the term's buffer from now on."""
        like = np.ascontiguousarray(like)
        shm, mapping = _create(max(like.nbytes, 1))
        array: NDArray[Any] = np.ndarray(like.shape, dtype=like.dtype, buffer=mapping)
        array[...] = like
        self._blocks.append((shm, array))
        return array

    def report(self, key: str, **parts: Any) -> None:
        """Declare ``key``'s report: each part a contiguous slice of an array from `array`
        (read as it is at publish time) or a number (a constant)."""
        spec = self.schema.keys.get(key)
        if spec is None:
            raise InvalidSchema(f"shared report for {key!r}: not a key of the run's schema")
        allowed = tuple(part for part, _, _, _ in spec.payload_parts())
        for part, data in parts.items():
            if part not in allowed:
                raise InvalidSchema(f"shared report for {key!r}: part {part!r} is not one of {allowed}")
            if isinstance(data, (int, float)):
                self.parts.append(SharedPart(key, part, constant=float(data)))
            else:
                self.parts.append(self._locate(key, part, np.asarray(data)))

    def _locate(self, key: str, part: str, view: NDArray[Any]) -> SharedPart:
        address = view.__array_interface__["data"][0]
        for i, (_, base) in enumerate(self._blocks):
            start = base.__array_interface__["data"][0]
            if start <= address < start + base.nbytes and view.dtype == base.dtype:
                if not view.flags.c_contiguous or address + view.nbytes > start + base.nbytes:
                    break
                return SharedPart(key, part, i, base.dtype.str, (address - start) // base.itemsize, view.size)
        raise InvalidSchema(f"shared report for {key!r}: part {part!r} is not a contiguous slice of a shared array")

    def begin(self) -> None:
        """Before the term writes its shared buffers: the sequence number turns odd."""
        self._seq[0] += 1

    def end(self) -> None:
        """After: even again, and the sidecar knows there is something new."""
        self._seq[0] += 1

    # ------------------------------------------------------------------ the fleet

    def receive(self, key: str, part: str) -> NDArray[Any]:
        """An array of the term's own that holds the fleet's ``part`` of ``key`` as last applied:
        everybody else's aggregate (merge: ``count``, ``sum``, ``sumsq`` of the others) or the
        ``value`` (broadcast, maximum). Zeros until a fleet state with the key was applied."""
        spec = self.schema.keys.get(key)
        if spec is None:
            raise InvalidSchema(f"shared fleet for {key!r}: not a key of the run's schema")
        flat = self._live[self._offsets[key] : self._offsets[key] + spec.width]
        parts = spec.parts_of(flat)
        if part not in parts:
            raise InvalidSchema(f"shared fleet for {key!r}: part {part!r} is not one of {tuple(parts)}")
        if key not in self.received:
            self.received.append(key)
        return parts[part]

    def on_take(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` right after each fleet state is taken (for a term that must recompute
        something at the reset boundary itself rather than when it next reads)."""
        self._on_take.append(callback)

    def take(self) -> bool:
        """At a reset boundary: copy a newer staged fleet state into the received arrays; True if
        one was taken. Copied to a scratch block first, so that a state the sidecar was rewriting
        meanwhile is never half taken."""
        seq = self.staged[0]
        if seq == self.taken or seq % 2:
            return False
        version = self.staged[1]
        self._scratch_bytes[:] = self._staging_bytes
        if self.staged[0] != seq:
            return False
        self._live_bytes[:] = self._scratch_bytes
        self.taken, self.applied = seq, version
        for callback in self._on_take:
            callback()
        return True

    # ------------------------------------------------------------------ life cycle

    def layout(self) -> dict[str, Any]:
        """What the sidecar needs to find the buffers (picklable)."""
        return {
            "control": self._control.name,
            "blocks": [(shm.name, max(a.nbytes, 1)) for shm, a in self._blocks],
            "parts": self.parts,
            "staging": (self._staging_shm.name, CONTROL_BYTES + max(self._staging.nbytes, 8)),
            "received": [(key, self._offsets[key], self.schema.keys[key].width) for key in self.received],
        }

    def _all_blocks(self) -> list[Block]:
        return [self._control, self._staging_shm] + [block for block, _ in self._blocks]

    def release(self) -> None:
        """Close the blocks' files (the sidecar is gone). The mappings stay while the term's arrays
        use them, so the term goes on working in memory of its own."""
        for block in self._all_blocks():
            block.release()

    def detach_forked(self) -> None:
        """In a forked child: the same arrays, on private memory from now on, so the child's terms
        neither write into its parent's reports nor see its parent's staged fleet states."""
        for block in self._all_blocks():
            privatize(block.mapping)
            block.release()


class _NotShared:
    """What an unshared term's writes are bracketed by (nothing) and its received version (none)."""

    applied = 0

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


NOT_SHARED = _NotShared()


class SidecarState:
    """The sidecar's side: consistent copies of the shared report parts; new fleet states staged."""

    def __init__(self, layout: dict[str, Any]):
        self._seq = memoryview(map_block(layout["control"], CONTROL_BYTES)).cast("q")
        self._blocks = [np.frombuffer(map_block(name, size), dtype=np.uint8) for name, size in layout["blocks"]]
        self.parts: list[SharedPart] = layout["parts"]
        name, size = layout["staging"]
        staging = map_block(name, size)
        self._staged = memoryview(staging).cast("q")
        self._staging: NDArray[np.float64] = np.ndarray(
            ((size - CONTROL_BYTES) // 8,), dtype=np.float64, buffer=staging, offset=CONTROL_BYTES
        )
        self.received: list[tuple[str, int, int]] = layout["received"]

    def snapshot(self, attempts: int = 100) -> tuple[int, dict[str, dict[str, Any]]] | None:
        """``(seq, {key: {part: float64 array or number}})`` copied while no write was under way;
        None when every attempt met one (the collector is inside a write: try again later)."""
        for _ in range(attempts):
            seq = self._seq[0]
            if seq % 2:
                continue
            copies = [block.copy() for block in self._blocks]
            if self._seq[0] != seq:
                continue
            reports: dict[str, dict[str, Any]] = {}
            for p in self.parts:
                if p.constant is not None:
                    value: Any = p.constant
                else:
                    value = copies[p.block].view(np.dtype(p.dtype))[p.offset : p.offset + p.count].astype(np.float64)
                reports.setdefault(p.key, {})[p.part] = value
            return seq, reports
        return None

    def stage(self, fleet: PullResult) -> None:
        """Write a new fleet state's received keys into the staging block (the others' aggregate of
        a merge key, the value of a broadcast key; a key never written keeps what was staged)."""
        if not self.received:
            return
        seq = self._staged[0] | 1  # odd: writing (already odd if a sidecar was killed while writing)
        self._staged[0] = seq
        for key, offset, width in self.received:
            view = fleet.keys.get(key)
            flat = None if view is None else view.others()
            if flat is not None:
                self._staging[offset : offset + width] = flat
        self._staged[1] = fleet.fleet_version
        self._staged[0] = seq + 1
