"""Drop-ins for the frameworks collectors run in: mjlab's tracking task (`.mjlab`), rsl_rl's
normaliser (`.rsl_rl`), holosoma's curriculum sync (`.holosoma`) and whole-body tracking
(`.holosoma_wbt`), MotrixLab's async FastSAC collectors (`.motrix`). Each module imports its
framework, so import the one you use.

A shard id is claimed once per process, so the terms of every integration in a process go through
one `Syncer`: each integration adds its terms to the process's
`ProcessFleet`, which starts the Syncer at the first env step, when the environment and the
runner have both been built. The environment names the store and the shard:

- ``REDISYNC_URL`` (unset: the embedded store) and ``REDISYNC_RUN`` (the run; ``default``);
- ``REDISYNC_SHARD``, else the rank ``torchrun`` sets (``RANK``), else 0.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from ..collector.seam import SyncedTerm
from ..collector.syncer import Syncer
from ..collector.workers import new_syncer
from ..errors import ConfigurationError
from ..store.client import Store, connect

ENV_RUN, ENV_SHARD = "REDISYNC_RUN", "REDISYNC_SHARD"


def store_from_env(run: str | None = None) -> Store:
    """The store the environment names (``REDISYNC_URL``, ``REDISYNC_RUN``)."""
    return connect(run=run or os.environ.get(ENV_RUN) or "default")


def fleet_shards_from_env() -> int | None:
    """The number of shards in the fleet where the launcher says (torchrun's ``WORLD_SIZE``), else None."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def shard_from_env() -> int:
    """This process's shard id: ``REDISYNC_SHARD``, else ``RANK``, else 0."""
    value = os.environ.get(ENV_SHARD) or os.environ.get("RANK") or "0"
    try:
        return int(value)
    except ValueError:
        raise ConfigurationError(f"the shard id must be an integer, got {ENV_SHARD}/RANK={value!r}") from None


class ProcessFleet:
    """The terms one process syncs and their Syncer, started on first use.

    Integrations `add` their terms while the task is built and `start` it once it is
    (``sync_normalizers`` and ``sync_curriculum`` do), so that registering the schema, claiming the
    shard and starting the sidecar happen before training; otherwise the first `on_step` (the
    first env step) or `flush` starts it, once. ``syncer_kwargs``
    (``publish_every_steps``, ``worker``, …) go to the Syncer; `configure` changes them before the start.
    """

    def __init__(self, store: Store | None = None, shard_id: int | None = None, **syncer_kwargs: Any):
        self._store, self.shard_id = store, shard_id if shard_id is not None else shard_from_env()
        self.syncer_kwargs = syncer_kwargs
        self.terms: list[SyncedTerm] = []
        self.syncer: Syncer | None = None
        self._stopped = False
        self._logged: dict[str, float] = {}
        self._logged_at = float("-inf")
        self._put_at: dict[int, float] = {}  # id of a framework's metric dict -> the reading last put there

    def configure(
        self, *, store: Store | None = None, shard_id: int | None = None, **syncer_kwargs: Any
    ) -> ProcessFleet:
        """Change the store, the shard id or the Syncer's options before the Syncer starts."""
        if self.syncer is not None:
            raise ConfigurationError("the fleet's Syncer has started: configure it before the first env step")
        self._store = store if store is not None else self._store
        self.shard_id = shard_id if shard_id is not None else self.shard_id
        self.syncer_kwargs.update(syncer_kwargs)
        return self

    def add(self, *terms: SyncedTerm) -> None:
        """Add terms to the process's Syncer; only before it starts (the first env step)."""
        if self.syncer is not None:
            raise ConfigurationError(
                "a term was added after the fleet's Syncer started (at the first env step): "
                "build every synced term before stepping the environment"
            )
        self.terms.extend(terms)

    def start(self) -> Syncer:
        """The Syncer of every term added so far (started once)."""
        if self.syncer is None:
            store = self._store if self._store is not None else store_from_env()
            self.syncer = new_syncer(store, self.shard_id, self.terms, **self.syncer_kwargs).start()
            atexit.register(self.stop)
        return self.syncer

    def log_metrics(self, every_s: float = 1.0) -> dict[str, float]:
        """The Syncer's metrics for the trainer's own logger, under ``redisync/...``: the worker's
        health, the staleness of the fleet state applied, publish latencies, counters and each term's
        drift (``redisync/<key>/drift_tv``, ...). Read afresh at most every ``every_s`` seconds (a
        logger's cadence: reading a term's drift costs device work), the last reading otherwise;
        empty before the Syncer starts. The drop-ins put these into each framework's logging."""
        if self.syncer is None:
            return {}
        now = time.monotonic()
        if now - self._logged_at >= every_s:
            self._logged, self._logged_at = self.syncer.metrics(), now
        return self._logged

    def put_metrics(self, into: MutableMapping[str, Any], convert: Callable[[float], Any] = float) -> None:
        """Write `log_metrics` into a framework's own metric dict (holosoma's ``env.log_dict``,
        MotrixLab's ``state.metrics``), each value converted the way that framework holds its values;
        only when they were read afresh (once a second), so a per-step call costs a clock read."""
        metrics = self.log_metrics()
        if metrics and self._put_at.get(id(into)) != self._logged_at:
            into.update({name: convert(value) for name, value in metrics.items()})
            self._put_at[id(into)] = self._logged_at

    def on_step(self) -> None:
        """One env step of this process: counts toward the next report (starts the Syncer once)."""
        (self.syncer or self.start()).on_step()

    def at_reset_boundary(self) -> bool:
        """Swap in the newest fleet state; before the first step (the env's own first reset) there is none."""
        return self.syncer is not None and self.syncer.at_reset_boundary()

    def flush(self) -> bool:
        """Hand the current reports over now (a sync point that comes once per rollout, say);
        False when no worker can publish them."""
        return (self.syncer or self.start()).flush()

    def stop(self) -> bool:
        """Publish the last reports and stop (also at interpreter exit); False when the last reports
        did not reach the store (the Syncer logged why)."""
        if self.syncer is not None and not self._stopped:
            self._stopped = True
            atexit.unregister(self.stop)
            self._published = self.syncer.stop()
        return getattr(self, "_published", self.syncer is None)


_process_fleet: ProcessFleet | None = None


def process_fleet() -> ProcessFleet:
    """This process's fleet (created on first use from the environment variables)."""
    global _process_fleet
    if _process_fleet is None:
        _process_fleet = ProcessFleet()
    return _process_fleet
