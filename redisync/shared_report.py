"""A term's report buffers in shared memory: the sidecar reads them without the collector's help.

With the process worker, a term that can keeps the buffers its reports are made of (the sampler's
own failure EMA, the normaliser's own count, Σx and Σx²) in shared memory, and goes on updating them
in place as it always did — between :meth:`SharedReport.begin` and :meth:`SharedReport.end`, the
two halves of a seqlock. When a publish is due, the sidecar copies the buffers and keeps the copy
only if the sequence number did not move meanwhile. The collector's ``on_step()`` is then a
counter: it never builds, encodes or copies a report, which is what keeps it within a few
microseconds whatever the publish rate.

A term opts in through ``share_report(shared) -> bool`` (see :mod:`redisync.seam`): it asks for
its buffers with :meth:`SharedReport.array`, uses the arrays it gets back from then on, and says
which slices of them are which part of which key with :meth:`SharedReport.report`. A term that
does not (or cannot: a buffer on an accelerator, a report that is not a slice of its state) stays
on the copy path, where ``on_step()`` hands its reports to the sidecar through the mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from .errors import InvalidSchema
from .mailbox import map_block
from .schema import MergeSpec, Schema

SEQ_BYTES = 64  # the control block: the seqlock's sequence number (int64), alone on its cache line


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


class SharedReport:
    """The collector's side: allocates the shared buffers and counts the terms' writes to them."""

    def __init__(self, schema: Schema):
        self.schema = schema
        self._control = shared_memory.SharedMemory(create=True, size=SEQ_BYTES)
        self._control_map = map_block(self._control.name, SEQ_BYTES)
        self._control.close()  # our own mapping outlives stop(): a term may write after its syncer stopped
        self._seq = memoryview(self._control_map).cast("q")
        self._seq[0] = 0
        self._blocks: list[tuple[shared_memory.SharedMemory, np.ndarray]] = []
        self.parts: list[SharedPart] = []

    def array(self, like: np.ndarray) -> np.ndarray:
        """A copy of ``like`` in shared memory (same shape and dtype): the term's buffer from now on."""
        like = np.ascontiguousarray(like)
        shm = shared_memory.SharedMemory(create=True, size=max(like.nbytes, 1))
        mapping = map_block(shm.name, max(like.nbytes, 1))
        shm.close()  # the creator's handle only unlinks; the arrays use our own mapping
        array = np.ndarray(like.shape, dtype=like.dtype, buffer=mapping)
        array[...] = like
        self._blocks.append((shm, array))
        return array

    def report(self, key: str, **parts: Any) -> None:
        """Declare ``key``'s report: each part a contiguous slice of an array from :meth:`array`
        (read as it is at publish time) or a number (a constant)."""
        spec = self.schema.keys.get(key)
        if spec is None:
            raise InvalidSchema(f"shared report for {key!r}: not a key of the run's schema")
        allowed = ("count", "sum", "sumsq") if isinstance(spec, MergeSpec) else ("value",)
        for part, data in parts.items():
            if part not in allowed:
                raise InvalidSchema(f"shared report for {key!r}: part {part!r} is not one of {allowed}")
            if isinstance(data, (int, float)):
                self.parts.append(SharedPart(key, part, constant=float(data)))
                continue
            self.parts.append(self._locate(key, part, np.asarray(data)))

    def _locate(self, key: str, part: str, view: np.ndarray) -> SharedPart:
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

    @property
    def seq(self) -> int:
        return self._seq[0]

    def layout(self) -> dict[str, Any]:
        """What the sidecar needs to find the buffers (picklable)."""
        return {"control": self._control.name, "blocks": [(shm.name, max(a.nbytes, 1)) for shm, a in self._blocks],
                "parts": self.parts}

    def release(self) -> None:
        """Unlink the blocks (the sidecar is gone). The mappings stay while the term's arrays use
        them, so the term goes on working in memory of its own."""
        for shm in [self._control] + [shm for shm, _ in self._blocks]:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass


class _NotShared:
    """What an unshared term's writes are bracketed by: nothing."""

    def begin(self) -> None:
        pass

    def end(self) -> None:
        pass


NOT_SHARED = _NotShared()


class SharedReportReader:
    """The sidecar's side: a consistent copy of the shared parts, as reports."""

    def __init__(self, layout: dict[str, Any]):
        self._seq = memoryview(map_block(layout["control"], SEQ_BYTES)).cast("q")
        self._blocks = [np.frombuffer(map_block(name, size), dtype=np.uint8) for name, size in layout["blocks"]]
        self.parts: list[SharedPart] = layout["parts"]

    @property
    def seq(self) -> int:
        return self._seq[0]

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
                    raw = copies[p.block].view(np.dtype(p.dtype))
                    value = raw[p.offset : p.offset + p.count].astype(np.float64)
                reports.setdefault(p.key, {})[p.part] = value
            return seq, reports
        return None
