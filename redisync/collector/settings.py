"""A collector's sync settings, declared once: their names, defaults, meaning and checks.

`new_syncer` names each of them (its defaults are read from here), the `Syncer` holds them as one
value, its workers read them from it, and the sidecar process receives them whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..store.schema import DEFAULT_LEASE_S


@dataclass(frozen=True)
class SyncSettings:
    """How a collector's sync paces itself.

    Attributes:
        publish_every_steps: a report is due after this many ``on_step()`` calls ...
        publish_every_s: ... or after this many seconds, whichever comes first.
        poll_every_s: how often the worker reads the fleet version when no announcement on the
            run's versions channel arrives (the channel makes a change known at once).
        min_pull_interval_s: the shortest time between two pulls of a changed fleet state.
        retry_every_s: the wait before retrying after the store could not be reached.
        start_timeout_s: how long ``start()`` waits for the store before it returns and goes on
            registering in the background.
        lease_s: how long the shard counts as live without a renewal (renewed every fifth of it): a
            collector that dies leaves the live fleet this long after its last renewal, plus a state
            key's ``lease_grace_s``; one paused longer (a debugger, a swapped-out process) leaves it
            too, and comes back with its next publish.
    """

    publish_every_steps: int = 50
    publish_every_s: float = 1.0
    poll_every_s: float = 1.0
    min_pull_interval_s: float = 0.1
    retry_every_s: float = 0.5
    start_timeout_s: float = 5.0
    lease_s: float = DEFAULT_LEASE_S

    def __post_init__(self) -> None:
        if isinstance(self.publish_every_steps, bool) or not isinstance(self.publish_every_steps, int):
            raise errors.ConfigurationError(
                f"publish_every_steps must be a whole number of steps, got {self.publish_every_steps!r}"
            )
        if self.publish_every_steps < 1:
            raise errors.ConfigurationError(f"publish_every_steps must be at least 1, got {self.publish_every_steps}")
        for field in dataclasses.fields(self):
            if field.name == "publish_every_steps":
                continue
            value = getattr(self, field.name)
            positive = field.name == "lease_s"  # a zero lease would lapse as it is renewed
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or math.isnan(value)
                or value < 0
                or (positive and value == 0)
            ):
                wanted = "a positive" if positive else "a non-negative"
                raise errors.ConfigurationError(f"{field.name} must be {wanted} number of seconds, got {value!r}")

    @classmethod
    def of(cls, arguments: Mapping[str, Any]) -> SyncSettings:
        """The settings among a function's arguments (its ``locals()`` on entry: `new_syncer` names
        every setting in its own signature, for its users' help and IDEs)."""
        return cls(**{field.name: arguments[field.name] for field in dataclasses.fields(cls)})

    def as_dict(self) -> dict[str, Any]:
        """The settings by name (what a sidecar process is handed)."""
        return dataclasses.asdict(self)
