"""A term's traffic with a CUDA device that never waits for the device.

A ``.cpu()`` of a CUDA tensor waits for every kernel queued before it, and a copy from pageable host
memory into the device waits as well: on a collector's hot path either stalls the step. Here both
directions go through pinned host buffers with ``non_blocking=True`` copies on the current stream,
and a CUDA event recorded after each copy says, when queried on a later call (never waited on),
whether the copy has landed:

- `DeviceReports`: a report is copied device-to-host when it is due and handed to the
  syncer on a later call, once its event has completed: a report is at most one publish interval
  old, and a slot-replacing key (the sampler's EMA, the normaliser's moments, the level histogram)
  loses nothing by that. `DeviceReports.settle` waits, for a flush or a stop only.
- `DeviceFleet`: a fleet state is written into a free pinned buffer and copied into the
  term's device tensor in stream order, so the kernels queued after it (the CDF's rebuild) see it.

Two buffers each way: a buffer is reused only once its event has completed. On the CPU neither is
used: the terms keep their plain copies there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch
from numpy.typing import NDArray


class Event(Protocol):
    """What is used of a ``torch.cuda.Event``: recorded after a copy, queried later."""

    def record(self) -> None:
        """Mark the current stream's position."""

    def query(self) -> bool:
        """Whether the work queued before the mark has completed (never waits)."""

    def synchronize(self) -> None:
        """Wait for it (flush and stop only)."""


def on_device(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on a CUDA device (where these paths are taken)."""
    return t.device.type == "cuda"


def _cuda_event() -> Event:
    event: Event = torch.cuda.Event()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    return event


class _Buffer:
    def __init__(self, shape: tuple[int, ...], pin: bool, event: Callable[[], Event]):
        self.host = torch.empty(shape, dtype=torch.float64, pin_memory=pin)
        self.event = event()
        self.busy = False  # a copy was queued into (or out of) it and has not been seen complete


class DeviceReports:
    """Device-to-host copies of one term's report, handed over once they have landed."""

    def __init__(self, size: int, *, pin: bool = True, event: Callable[[], Event] = _cuda_event):
        self._buffers = [_Buffer((size,), pin, event) for _ in range(2)]
        self._order: list[_Buffer] = []  # copies in flight, oldest first
        self._ready: NDArray[np.float64] | None = None
        self.skipped = 0  # reports not started because both buffers were still in flight

    def report(self, source: torch.Tensor) -> NDArray[np.float64] | None:
        """Start copying ``source`` (flattened, as float64) and return the newest report whose copy
        has landed (None before the first has): no call here waits for the device."""
        self._collect()
        free = next((b for b in self._buffers if not b.busy), None)
        if free is None:
            self.skipped += 1  # the device is behind by two reports: the next due one tries again
        else:
            free.host.copy_(source.detach().reshape(-1), non_blocking=True)
            free.event.record()
            free.busy = True
            self._order.append(free)
        return self._ready

    def settle(self, source: torch.Tensor) -> NDArray[np.float64]:
        """The current report, waiting for the device (for a flush or a stop, never the hot path)."""
        for b in self._order:
            b.event.synchronize()
        self._collect()
        now: NDArray[np.float64] = source.detach().to("cpu", torch.float64).reshape(-1).numpy().copy()
        self._ready = now
        return now

    def _collect(self) -> None:
        while self._order and self._order[0].event.query():
            done = self._order.pop(0)
            self._ready = done.host.numpy().copy()  # (a host copy: the buffer is reused by the next report)
            done.busy = False


def copy_counts(reports: DeviceReports | None, fleet: DeviceFleet | None = None) -> dict[str, int]:
    """What a term's device copies have left undone so far (its ``device_copies()``, which the
    syncer's metrics sum over its terms): reports not started because the device was two reports
    behind, fleet states left for a later boundary because both buffers were still being read. Zero
    for a term whose state is on the CPU."""
    return {
        "device_reports_skipped": 0 if reports is None else reports.skipped,
        "device_fleet_deferred": 0 if fleet is None else fleet.deferred,
    }


class DeviceFleet:
    """Host-to-device copies of the fleet states a term takes in, from pinned buffers, in stream order."""

    def __init__(self, size: int, *, pin: bool = True, event: Callable[[], Event] = _cuda_event):
        self._buffers = [_Buffer((size,), pin, event) for _ in range(2)]
        self.deferred = 0  # fleet states left for a later boundary: both buffers were still being read

    def copy(self, values: Any, into: torch.Tensor) -> bool:
        """Queue ``values`` (host numbers) into the device tensor ``into``; False, and nothing
        queued, when both buffers are still being read by earlier copies (try at the next boundary)."""
        free = None
        for b in self._buffers:
            if b.busy and b.event.query():
                b.busy = False
            if free is None and not b.busy:
                free = b
        if free is None:
            self.deferred += 1
            return False
        free.host.numpy()[:] = np.asarray(values, dtype=np.float64).reshape(-1)
        into.view(-1).copy_(free.host, non_blocking=True)
        free.event.record()
        free.busy = True
        return True
