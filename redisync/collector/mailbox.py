"""A shared-memory mailbox between a collector and its sidecar: three seqlocked slots and a header.

The collector writes its latest reports to the **outbox**; the sidecar writes the latest decoded
fleet state to the **inbox** and its health and counters to the **status** slot. Each slot has one
writer, which makes its sequence number odd while it writes and even when done; a reader copies the
bytes and keeps them only if the sequence number did not move meanwhile (a seqlock). No lock is ever
shared, so neither side can make the other wait: the collector's handover is a copy and two stores.

A slot holds the latest message only (older ones are replaced), which is what cumulative reports and
a versioned fleet state want. The header also carries a few counters the two sides share (the stop
request, the last report the store answered for, the sequence number reserved before a fold is
sent, the newest fleet state handed to the collector, the sidecar's heartbeat, the collector's steps
and flush requests for the shared terms of `redisync.collector.shared_state`): what a restarted sidecar
must know lives here, never in the sidecar (see `redisync.collector.sidecar` for the invariants).

Blocks are anonymous memory files (``memfd_create``), named by their ``/proc/<pid>/fd/<n>`` path
while the creator lives: the kernel frees one when the last process holding it exits, whatever
killed it, so nothing can be left behind in ``/dev/shm``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import RedisyncError
from ..store.codec import epoch_tag

HEADER = 32  # int64 fields
# header fields
STOP = 8  # 1: the collector asks the sidecar to publish what it holds and exit
STOP_CAUSE = 9  # why (an index into lifeline.STOP_CAUSES): the lease is given up for it
DONE = 10  # the outbox sequence number of the last report the store answered for (applied, duplicate or refused)
HEARTBEAT_MS = 11  # the sidecar's monotonic clock in ms, written every loop: a hung sidecar stops it
SIDECAR_PID = 12
INCARNATION = 13  # the shard's incarnation + 1 once claimed (0: not yet): a restarted sidecar keeps it
FLUSHED = 14  # the last flush request whose shared reports the store answered for
SEQ = 15  # the highest fold sequence number a sidecar reserved (written before the fold is sent)
HANDED = 16  # the newest fleet state handed to the collector: epoch_tag(epoch) << 32 | fleet version
# written by the collector on every step: a cache line of their own, away from the sidecar's writes
STEPS = 24  # the collector's env steps so far: the sidecar publishes shared reports on this count
FLUSH = 25  # the collector's flush requests so far (flush(), stop())
OUTBOX, INBOX, STATUS = 0, 1, 2  # slot numbers: fields 2*slot and 2*slot+1 hold seq and length
STATUS_BYTES = 16 << 10


def pack_handed(epoch: str, version: int) -> int:
    """The hand-over word: the number of reports handed to the sidecar, packed with its flags."""
    return epoch_tag(epoch) << 32 | (version & 0xFFFFFFFF)


def unpack_handed(word: int) -> tuple[int, int] | None:
    """``(epoch tag, version)`` of a `HANDED` word, or None when nothing was handed yet."""
    return None if word == 0 else (word >> 32, word & 0xFFFFFFFF)


class Block:
    """One block of shared memory the creator holds: an anonymous memory file and its mapping."""

    def __init__(self, size: int, tag: str = "redisync"):
        self.size = max(size, 1)
        self.fd = os.memfd_create(tag, os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.mapping = mmap.mmap(self.fd, self.size)
        self.name = f"/proc/{os.getpid()}/fd/{self.fd}"  # what another process opens while we live

    def release(self) -> None:
        """Close the file; the memory goes when the last mapping of it does."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def map_block(name: str, size: int) -> mmap.mmap:
    """Map a block another process created, by the name it gave it."""
    fd = os.open(name, os.O_RDWR)
    try:
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


_PROT_RW, _MAP_PRIVATE_FIXED_ANON = 0x1 | 0x2, 0x02 | 0x10 | 0x20


def privatize(mapping: mmap.mmap) -> None:
    """Replace a shared mapping by private memory holding the same bytes, at the same address, so
    that the arrays on it keep working but no longer write into (or see) the shared block. For a
    forked child, which must never touch its parent's sync."""
    size = len(mapping)
    data = mapping[:]
    anchor = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(anchor)
    del anchor
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    if libc.mmap(address, size, _PROT_RW, _MAP_PRIVATE_FIXED_ANON, -1, 0) != address:
        raise OSError(ctypes.get_errno(), "mmap(MAP_FIXED) failed while detaching a forked child's shared memory")
    ctypes.memmove(address, data, size)


class MailboxFull(RedisyncError, ValueError):
    """A message is larger than its slot (sized from the schema): a report of unexpected size."""


class Mailbox:
    """One block of shared memory: a header and the outbox, inbox and status slots."""

    def __init__(self, name: str, buf: Any, sizes: tuple[int, int, int], closer: Any):
        self.name, self.sizes, self._closer, self.mapping = name, sizes, closer, buf
        offsets = np.cumsum((HEADER * 8, *sizes))
        self._buf = memoryview(buf)
        self.header = self._buf[: HEADER * 8].cast("q")  # int64 fields; a memoryview reads and writes faster than numpy
        self._slots = [self._buf[offsets[i] : offsets[i] + sizes[i]] for i in range(3)]
        self._floats: list[NDArray[np.float64]] = [
            np.ndarray((size // 8,), dtype=np.float64, buffer=buf, offset=int(offsets[i]))
            for i, size in enumerate(sizes)
        ]

    @classmethod
    def create(cls, outbox_bytes: int, inbox_bytes: int) -> Mailbox:
        """A new mailbox in anonymous shared memory (memfd), sized for the schema's reports."""
        sizes = (outbox_bytes, inbox_bytes, STATUS_BYTES)
        block = Block(HEADER * 8 + sum(sizes), "redisync-mailbox")  # zero-filled

        def free() -> None:
            block.release()
            block.mapping.close()

        return cls(block.name, block.mapping, sizes, free)

    @classmethod
    def attach(cls, name: str, sizes: tuple[int, int, int]) -> Mailbox:
        """Map a block the collector created."""
        mapped = map_block(name, HEADER * 8 + sum(sizes))
        return cls(name, mapped, sizes, mapped.close)

    def seq(self, slot: int) -> int:
        """The sequence number of a slot (odd while it is being written: the seqlock)."""
        return self.header[2 * slot]

    def write(self, slot: int, message: Any) -> int:
        """Replace the slot's message (one writer per slot); returns its sequence number."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > self.sizes[slot]:
            raise MailboxFull(f"a message of {len(data)} bytes does not fit its {self.sizes[slot]}-byte slot")
        h = self.header
        seq = h[2 * slot] | 1  # odd: writing (already odd if a writer was killed while writing)
        h[2 * slot] = seq
        self._slots[slot][: len(data)] = data
        h[2 * slot + 1] = len(data)
        h[2 * slot] = seq + 1
        return seq + 1

    def write_vectors(self, slot: int, vectors: Sequence[tuple[int, Any]]) -> int:
        """Replace the slot's message with tagged float64 vectors, copied in place: no pickling, for
        the collector's hot path. ``vectors`` are ``(tag, numbers)`` pairs."""
        arrays: list[tuple[int, float | NDArray[np.float64]]] = [
            (tag, v if type(v) is float else np.asarray(v, dtype=np.float64).reshape(-1)) for tag, v in vectors
        ]
        start = 1 + 2 * len(arrays)
        end = start + sum(a.size if isinstance(a, np.ndarray) else 1 for _, a in arrays)
        view = self._floats[slot]
        if end > view.size:
            raise MailboxFull(f"a message of {end * 8} bytes does not fit its {self.sizes[slot]}-byte slot")
        h = self.header
        seq = h[2 * slot] | 1  # odd: writing (already odd if a writer was killed while writing)
        h[2 * slot] = seq
        view[0] = len(arrays)
        o = start
        for i, (tag, a) in enumerate(arrays):
            n = a.size if isinstance(a, np.ndarray) else 1
            view[1 + 2 * i], view[2 + 2 * i] = tag, n
            view[o : o + n] = a
            o += n
        h[2 * slot + 1] = end * 8
        h[2 * slot] = seq + 1
        return seq + 1

    def read_vectors(self, slot: int, newer_than: int) -> tuple[int, list[tuple[int, NDArray[Any]]]] | None:
        """What `write_vectors` wrote, as `read` does: None when nothing new is complete."""
        h = self.header
        seq = h[2 * slot]
        if seq == newer_than or seq % 2 or seq == 0:
            return None
        flat = self._floats[slot][: h[2 * slot + 1] // 8].copy()
        if h[2 * slot] != seq:
            return None
        n = int(flat[0])
        out, o = [], 1 + 2 * n
        for i in range(n):
            size = int(flat[2 + 2 * i])
            out.append((int(flat[1 + 2 * i]), flat[o : o + size]))
            o += size
        return seq, out

    def read(self, slot: int, newer_than: int) -> tuple[int, Any] | None:
        """``(seq, message)`` if the slot holds a complete message newer than ``newer_than``; None
        when there is none or the writer is busy (ask again later, never wait)."""
        h = self.header
        seq = h[2 * slot]
        if seq == newer_than or seq % 2 or seq == 0:
            return None
        data = bytes(self._slots[slot][: h[2 * slot + 1]])
        if h[2 * slot] != seq:
            return None  # torn: rewritten while we copied
        return seq, pickle.loads(data)

    def close(self) -> None:
        """Detach; the creator (the collector) also frees the block."""
        self.header.release()
        self._slots, self._floats = [], []
        self._buf.release()
        self._closer()
