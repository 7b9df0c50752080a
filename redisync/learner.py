"""The learner's read-only side: fleet metrics for logging, the fleet state for checkpoints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from .store.client import RunSnapshot, Store
from .store.codec import PullResult
from .store.schema import Schema


@runtime_checkable
class ViewsFleetMetrics(Protocol):
    """A learner-side term that adds its own view of the fleet to `FleetMonitor.metrics`."""

    def fleet_metrics(self, fleet: PullResult) -> Mapping[str, float]:
        """Its figures of the fleet state, by name."""


@runtime_checkable
class ViewsFleetDistribution(Protocol):
    """A learner-side sampler term whose fleet distribution `FleetMonitor.distributions` shows."""

    key: str

    def fleet_probabilities(self, fleet: PullResult) -> Any:
        """The distribution the fleet samples from (None when it has none yet)."""


class FleetMonitor:
    """Follows a run without a slot of its own. ``refresh()`` costs one round trip.

    Args:
        store: the run's store.
        schema: registered first, when given (a learner that may start before any collector).
        terms: the learner's copies of collector terms (the same configuration, no slot): a term
            that `ViewsFleetMetrics` adds its own view of the fleet to `metrics`, one that
            `ViewsFleetDistribution` (the adaptive sampler, per group) shows in `distributions`.
    """

    def __init__(self, store: Store, schema: Schema | None = None, terms: Iterable[Any] = ()):
        self.store = store
        if schema is not None:
            store.register(schema)
        self.terms = list(terms)
        self.state: PullResult | None = None

    def refresh(self) -> PullResult | None:
        """Pull what changed; None when nothing did. ``self.state`` holds the whole fleet state."""
        changed = self.store.pull(None, self.state)
        if changed is not None:
            keys = changed.keys if self.state is None or changed.epoch_changed else {**self.state.keys, **changed.keys}
            self.state = PullResult(
                changed.epoch, changed.fleet_version, changed.epoch_changed, keys, changed.server_time_us
            )
        return changed

    def metrics(self) -> dict[str, float]:
        """Flat, logger-ready: the fleet version, and per key its version and pooled count or scalar value."""
        if self.state is None:
            self.refresh()
        state = self.state
        assert state is not None
        out = {"redisync/fleet_version": float(state.fleet_version)}
        for name, view in state.keys.items():
            out[f"redisync/{name}/version"] = float(view.version)
            parts = view.parts()
            if not parts:
                continue
            out.update(view.spec.metrics(name, parts))
        for term in self.terms:
            if isinstance(term, ViewsFleetMetrics):
                out.update(term.fleet_metrics(state))
        return out

    def distributions(self) -> dict[str, Any]:
        """Per sampler key, the distribution the fleet samples from (``[groups, bins]`` when grouped)."""
        if self.state is None:
            self.refresh()
        state = self.state
        assert state is not None
        found = {
            term.key: term.fleet_probabilities(state) for term in self.terms if isinstance(term, ViewsFleetDistribution)
        }
        return {key: probs for key, probs in found.items() if probs is not None}

    def state_dict(self) -> dict[str, Any]:
        """The whole run, JSON-safe, to put into the learner's checkpoint."""
        return self.store.snapshot().model_dump()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the run from a checkpoint (a new epoch: every collector takes the restored state)."""
        self.store.restore(RunSnapshot.model_validate(state))
        self.state = None
