"""When a report is due: every ``every_steps`` of the collector's steps or ``every_s`` seconds.

One rule for every place that decides it: the `Syncer` counts its own steps on the hot path; the
sidecar process reads the collector's step count from the mailbox header and decides when to read
the shared terms' buffers (`redisync.collector.sidecar_process`).
"""

from __future__ import annotations

import time


class Cadence:
    """Steps and seconds since the last report taken: a report falls due after ``every_steps``
    steps or ``every_s`` seconds, whichever comes first."""

    def __init__(self, every_steps: int, every_s: float, *, taken_at: float | None = None):
        self.every_steps, self.every_s = every_steps, every_s
        self.steps_at = 0  # the step count at the last report taken
        self.time_at = time.monotonic() if taken_at is None else taken_at  # and the time
        self._steps = 0  # steps counted by `step` (a cadence that counts its own)

    def due(self, steps: int, now: float) -> bool:
        """Whether a report is due at step count ``steps`` (the hot path's or the header's) and time ``now``."""
        return steps - self.steps_at >= self.every_steps or now - self.time_at >= self.every_s

    def step(self) -> bool:
        """Count one step of this process's own: whether a report is due."""
        self._steps += 1
        return self.due(self._steps, time.monotonic())

    def taken(self, steps: int | None = None, now: float | None = None) -> None:
        """A report was taken at step count ``steps`` (default: the steps counted here) and time ``now``."""
        self.steps_at = self._steps if steps is None else steps
        self.time_at = time.monotonic() if now is None else now
