"""What an operator asks of a store: which runs, which keys and slots, how stale, how far apart.

Read-only, plain data (dicts and lists) for ``redisync inspect`` and ``redisync watch`` to print
as tables or JSON. Times are judged by the server's clock, the one that stamped the slots.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .errors import RedisyncError
from .store.client import LeaseReading, ServerError, Store
from .store.keys import ROOT
from .store.schema import MEASURED_DRIFT_SUFFIX, KeySpec, MergeSpec
from .store.semantics.base import age_s


def describe_runs(
    server: Store, store_of: Callable[[str], Store]
) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """Every readable run described, and ``(meta key, why)`` for each key that only looks like a
    run's meta (a foreign name, a meta of another type or without a schema, a run deleted meanwhile)."""
    runs, skipped = [], []
    for name in server.run_names():
        try:
            runs.append(describe_run(store_of(name)))
        except (RedisyncError, ServerError, ValueError) as e:
            skipped.append((f"{ROOT}:{{{name}}}:meta", f"{type(e).__name__}: {e}"))
    return runs, skipped


def describe_run(store: Store, dead_letters: int = 5) -> dict[str, Any]:
    """Run metadata, stream lengths, the newest dead letters and, per key, its slots and their ages."""
    now = store.server_time_us()
    info = store.run_info()
    keys = []
    for name, spec in store.schema.keys.items():
        meta = store.key_info(name)
        row: dict[str, Any] = {
            "key": name,
            "semantics": spec.semantics,
            "shape": list(spec.shape),
            "version": int(meta.get("version", 0)),
            "updated_age_s": age_s(now, meta.get("updated_at_us")),
        }
        row.update(spec.describe(meta, lambda fields, name=name: store.key_fields(name, fields), now))
        keys.append(row)
    reading = store.leases()
    reports, dead_letter_count = store.stream_lengths()
    dead = [
        {k: v for k, v in entry.items() if not k.startswith("report:")}
        for entry in (store.dead_letters(dead_letters) if dead_letters > 0 else [])
    ]
    return {
        "run": store.run,
        "epoch": info["epoch"],
        "fleet_version": int(info["fleet_version"]),
        "created_age_s": age_s(now, info.get("created_at_us")),
        "updated_age_s": age_s(now, info.get("updated_at_us")),
        "reports": reports,
        "dead_letters": dead_letter_count,
        "newest_dead_letters": dead,
        "shards": shard_ages(store, now),
        "leases": {str(shard): state for shard, state in shard_leases(store).items()},
        # how long no collector has called the run (a dead fleet's leases stay live in its own clock)
        "quiet_s": None if reading.last_call_us is None else max(0, reading.now_us - reading.last_call_us) / 1e6,
        "stall_cap_s": reading.stall_cap_us / 1e6,
        "keys": keys,
    }


def shard_ages(store: Store, now_us: int | None = None) -> dict[int, float]:
    """Seconds since each shard's last accepted report."""
    return {shard: row["age_s"] for shard, row in shard_reports(store, now_us).items()}


def shard_reports(store: Store, now_us: int | None = None) -> dict[int, dict[str, Any]]:
    """Per shard that has reported: ``age_s``, the seconds since its last accepted report; ``seen``,
    the highest fleet version it had seen when it made that report, and ``behind``, how many versions
    before the one its report made it had not seen (None where the fold did not record them)."""
    now = now_us if now_us is not None else store.server_time_us()
    raw = store.shards_info()
    out: dict[int, dict[str, Any]] = {}
    for field, value in raw.items():
        shard, what = field.split(":", 1)
        if what == "at_us" and (age := age_s(now, value)) is not None:
            seen, made = raw.get(f"{shard}:seen"), raw.get(f"{shard}:made")
            out[int(shard)] = {
                "age_s": age,
                "seen": int(seen) if seen else None,
                "behind": max(int(made) - 1 - int(seen), 0) if seen and made else None,
            }
    return out


LEASE_STATES = ("live", "lapsed", "stopped", "aborted")


class ServiceWatch:
    """What an observer (watch, the exporter) has seen of a server serving: since when it has
    answered every look without a gap longer than the run's stall cap. A server that has answered
    this observer continuously for longer than that, past the run's last call, could have served the
    collectors' renewals too: that time counts in the served clock for this observer, so a fleet that
    died whole lapses (the fold's own clock advances only with the run's calls, and a dead fleet makes
    none), while a stalled server (no answers) still lapses nobody."""

    def __init__(self) -> None:
        self.since_us: int | None = None  # the server's time at the first answer of the current streak
        self.last_us: int | None = None

    def saw(self, reading: LeaseReading) -> None:
        """One answer of the server, at its time ``reading.now_us``."""
        gap = None if self.last_us is None else reading.now_us - self.last_us
        if gap is None or gap < 0 or gap > reading.stall_cap_us:
            self.since_us = reading.now_us  # the first look, a clock step, or a gap: a new streak
        self.last_us = reading.now_us

    def served_us(self, reading: LeaseReading) -> int:
        """The served clock for this observer: the fold's, plus the time past the stall cap that the
        server has answered this observer since the run's last call."""
        if self.since_us is None or reading.last_call_us is None:
            return reading.served_us
        seen = reading.now_us - max(self.since_us, reading.last_call_us)
        return reading.served_us + max(0, seen - reading.stall_cap_us)


def shard_leases(store: Store, watch: ServiceWatch | None = None) -> dict[int, str]:
    """Per shard that holds or held a lease: ``live`` (its lease runs in the run's served clock),
    ``lapsed`` (it ran out: a dead, or paused, collector), ``stopped`` (given up by a clean stop) or
    ``aborted`` (given up as its process was ended: the trainer that started it died, or a SIGTERM;
    a crash or a cancel, not a finish).
    The served clock is the fold's own, read by ``leases.lua`` with clock.lua's rule (the server's
    time less what it did not serve the run); with ``watch``, an observer's continuous view of the
    server serving also counts (`ServiceWatch`), so a whole fleet that died lapses."""
    reading = store.leases()
    served = reading.served_us
    if watch is not None:
        watch.saw(reading)
        served = watch.served_us(reading)
    return {
        shard: _lease_state(until, served, reading.stopped.get(shard))
        for shard, until in reading.alive_until_us.items()
    }


def _lease_state(until_us: int, served_us: int, stop_cause: str | None) -> str:
    if until_us < 0:
        return "stopped" if stop_cause in (None, "clean") else "aborted"
    return "live" if until_us >= served_us else "lapsed"


def slot_parts(store: Store, name: str) -> tuple[dict[str, np.ndarray] | None, dict[int, dict[str, np.ndarray]]]:
    """A merge key's aggregate and every live slot, in parts (``count``, ``sum``, ``sumsq``), by shard."""
    spec = store.schema.keys[name]
    assert isinstance(spec, MergeSpec), name
    return spec.stored_parts(store.key_vectors(name))


def drift(store: Store) -> dict[str, dict[str, Any]]:
    """How far each shard's own slot is from the pooled value, in the measure the key's kind allows.

    - ``distribution`` (a merge key of several non-negative elements without moments: a failure
      EMA, a histogram): the total-variation distance of the shard's normalised slot from the
      pooled distribution, and its normalised entropy.
    - ``moments`` (a merge key with ``sumsq``: normaliser statistics): the largest offset of the
      shard's mean from the pooled mean, in pooled standard deviations.

    Other keys (scalars, signed sums) have no such measure and are left out.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, spec in store.schema.keys.items():
        if spec.drift_measure() is not None and not name.endswith(MEASURED_DRIFT_SUFFIX):
            measured = _drift_of(store, name, spec)
            if measured is not None:
                out[name] = measured
    return out


def measured_drift(store: Store) -> dict[str, dict[int, float]]:
    """Per key, each observing shard's own measured drift (``<key>.drift_tv``: its sampling
    distribution's TV from the pooled one at its last report, the mean over its groups) — the
    sampler's formulas, uniform mix and kernel included, which the store's slots alone cannot give."""
    out: dict[str, dict[int, float]] = {}
    for name in store.schema.keys:
        if name.endswith(MEASURED_DRIFT_SUFFIX):
            _, slots = slot_parts(store, name)
            if slots:
                out[name.removesuffix(MEASURED_DRIFT_SUFFIX)] = {
                    shard: float(np.mean(parts["sum"])) for shard, parts in slots.items()
                }
    return out


def _drift_of(store: Store, name: str, spec: KeySpec) -> dict[str, Any] | None:
    """One key's drift row (see `drift`), or None when its value has no such measure."""
    agg, slots = slot_parts(store, name)
    if agg is None:
        return None
    if spec.drift_measure() == "moments":
        mean, sd = _moments(agg)
        if mean is None:
            return None
        rows = {
            s: {"offset_sd": float(np.max(np.abs(m - mean) / sd))}
            for s, p in slots.items()
            if (m := _moments(p)[0]) is not None
        }
        return {"kind": "moments", "shards": rows}
    if np.any(agg["sum"] < 0):
        return None
    pooled = _distribution(agg["sum"])
    if pooled is None:
        return None
    shards: dict[int, dict[str, Any]] = {}
    for shard, parts in slots.items():
        own = _distribution(parts["sum"])
        if own is not None:
            shards[shard] = {
                "tv": 0.5 * float(np.abs(own - pooled).sum()),
                "entropy": _entropy(own),
                "sum": np.ravel(parts["sum"]),
            }
    return {
        "kind": "distribution",
        "pooled_entropy": _entropy(pooled),
        "pooled_sum": np.ravel(agg["sum"]),
        "shards": shards,
    }


class SampledDistance:
    """How far what each synced shard *samples* is from the pooled distribution now.

    A shard of a pooled key samples from the rest of the fleet as it was at the fleet version it
    holds, plus its own current EMA: ``pooled(v) − own(v) + own(now)``. The store keeps only the
    current state, so an observer that polls (``redisync watch``) records the states it sees and
    judges each shard at the newest recorded version at or below the one the shard had seen — an
    upper bound on its lag, so the distance errs high. None where no such record exists yet.
    """

    def __init__(self, keep: int = 256):
        self._keep = keep
        self._records: dict[int, dict[str, dict[str, Any]]] = {}

    def observe(self, fleet_version: int, drifts: dict[str, dict[str, Any]]) -> None:
        """Record the drift rows read at ``fleet_version`` (the newest ``keep`` versions are kept)."""
        self._records[fleet_version] = {k: d for k, d in drifts.items() if d["kind"] == "distribution"}
        for old in sorted(self._records)[: max(0, len(self._records) - self._keep)]:
            del self._records[old]

    def distance(self, key: str, shard: int, seen: int | None, drifts: dict[str, dict[str, Any]]) -> float | None:
        """The TV distance of what ``shard`` samples from the pooled distribution now, or None."""
        now = drifts.get(key)
        if seen is None or now is None or now["kind"] != "distribution" or shard not in now["shards"]:
            return None
        held = [v for v in self._records if v <= seen and key in self._records[v]]
        if not held:
            return None
        then = self._records[max(held)][key]
        own_then = then["shards"].get(shard, {}).get("sum", 0.0)
        sampled = _distribution(np.maximum(then["pooled_sum"] - own_then + now["shards"][shard]["sum"], 0.0))
        pooled = _distribution(now["pooled_sum"])
        if sampled is None or pooled is None:
            return None
        return 0.5 * float(np.abs(sampled - pooled).sum())


def _moments(parts: dict[str, np.ndarray]) -> tuple[np.ndarray | None, np.ndarray]:
    """Mean and standard deviation (floored, so a constant element does not divide by zero)."""
    count = np.asarray(parts["count"], dtype=np.float64)
    if np.any(count <= 0):
        return None, np.ones(1)
    mean = parts["sum"] / count
    var = np.maximum(parts["sumsq"] / count - mean**2, 0.0)
    return mean, np.maximum(np.sqrt(var), 1e-12)


def _distribution(sums: np.ndarray) -> np.ndarray | None:
    sums = np.ravel(sums)
    total = sums.sum()
    return sums / total if total > 0 and np.all(sums >= 0) else None


def _entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum() / np.log(p.size))
