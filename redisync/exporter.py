"""A Prometheus exporter of a store's runs: what ``redisync watch`` shows, as metrics to scrape.

Every scrape reads the store afresh (nothing is cached but the fleet states the sampled distance
needs, as ``watch`` keeps them) with read-only commands, so the ``inspector`` role of
``deploy/users.acl`` suffices. Labels are ``run``, ``shard`` and ``key``: their number is bounded
by the runs on the server, the shards of each run and the keys of its schema. A store that cannot
be read turns ``redisync_store_up`` to 0 and exports nothing else: a dashboard never shows old
figures as current. A run the exporter cannot describe (a malformed meta, a key of the wrong type, a
slot no Cluster node serves) is one ``redisync_run_error`` series for that run, with its reason's
type, and no other series of it; the other runs are exported as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .errors import RedisyncError
from .inspection import (
    LEASE_STATES,
    SampledDistance,
    ServiceWatch,
    describe_run,
    drift,
    measured_drift,
    shard_leases,
    shard_reports,
)
from .store.client import ServerError, Store, connect

log = logging.getLogger(__name__)

# every metric the exporter writes, with its help text (the dashboard's and the alerts' test reads it)
METRICS = {
    "redisync_store_up": "1 when the store answered this scrape, 0 when it did not or refused a read (the exporter's log says which)",
    "redisync_run_error": "1 for a run this scrape could not describe, labelled with the error's type (the exporter's log says more)",
    "redisync_run_fleet_version": "the run's fleet version: one more per fold (rate: folds per second)",
    "redisync_run_updated_age_seconds": "seconds since the run's last fold",
    "redisync_run_dead_letters": "reports refused and kept in the run's dead-letter stream (its length)",
    "redisync_run_shards": "the run's shards by lease state (live, lapsed, stopped, aborted)",
    "redisync_shard_lease_state": "1 for the shard's lease state (live, lapsed, stopped, aborted), 0 for the others",
    "redisync_shard_report_age_seconds": "seconds since the shard's last folded report",
    "redisync_shard_versions_behind": "fleet versions made before the shard's last report that it had not seen",
    "redisync_shard_unsynced_tv": "total-variation distance of the shard's own distribution from the pooled one (what it would sample without sync)",
    "redisync_shard_sampled_tv": "total-variation distance of what the shard samples from the pooled distribution now",
    "redisync_shard_measured_tv": "an observing shard's own measured drift: its sampling distribution's total-variation distance from the pooled one at its last report",
    "redisync_key_dropped_lapsed": "slots this key dropped because their shard's lease lapsed or was given up by a clean stop",
    "redisync_key_dropped_stale": "slots this key dropped because they were older than its stale_after_s",
    "redisync_key_retired_departed": "slots this history key retired (their samples kept) because their shard had been gone for its retire_after_s",
    "redisync_slot_stale": "1 where a shard's slot of a key is older than the key's stale_after_s (it leaves a state key at the next fold)",
}


SCRAPE_CALL_TIMEOUT_S = 2.0
"""How long one of a scrape's calls waits for the store: a hung store fails the scrape's first call and
its PING (2 × this) inside the 10 s scrape timeout of deploy/prometheus/prometheus.yml."""


class FleetCollector(Collector):
    """The metrics of ``runs`` (every run on the server when empty) of the store at ``url``."""

    def __init__(self, url: str, runs: tuple[str, ...] = (), timeout_s: float = SCRAPE_CALL_TIMEOUT_S):
        self.url, self.runs, self.timeout_s = url, runs, timeout_s
        self._connected: Store | None = None  # the server's store, made at the first scrape the store answers
        self._stores: dict[str, tuple[Any, Store]] = {}  # per run: (its epoch, its store), kept across scrapes
        self._sampled: dict[str, tuple[str, SampledDistance]] = {}  # per run: its epoch's fleet states seen
        self._said = ""  # the last failure logged (each new one is logged once)
        self._run_errors: set[str] = set()  # the runs' failures logged
        self._service: dict[str, ServiceWatch] = {}  # per run: the server seen serving (a dead fleet lapses)

    @property
    def _server(self) -> Store:
        """The server's store, connected on first use: a Cluster client reads the slot map when it is
        made, and an exporter started while every node is down must serve ``redisync_store_up 0``."""
        if self._connected is None:
            self._connected = self._connect("_exporter")
        return self._connected

    def _connect(self, run: str) -> Store:
        """A store whose every call waits at most ``timeout_s``, without a retry: a hung store makes a
        scrape say ``redisync_store_up 0`` well within Prometheus' scrape timeout, instead of timing
        the scrape out (the target then goes down and every alert on these metrics goes quiet)."""
        return connect(self.url, run=run, call_timeout_s=self.timeout_s, retries=0)

    def describe(self) -> Iterator[Any]:
        """Nothing: the registry would otherwise call collect() at registration, when the store may not answer yet."""
        return iter(())

    def collect(self) -> Iterator[Any]:
        """One scrape: the store read now (``redisync_store_up`` 0 and nothing else when it cannot be)."""
        up = GaugeMetricFamily("redisync_store_up", METRICS["redisync_store_up"])
        try:
            families = self._families()
        except (RedisyncError, ServerError, OSError) as e:
            if f"{type(e).__name__}: {e}" != self._said:
                self._said = f"{type(e).__name__}: {e}"
                log.warning("redisync exporter: the store could not be read: %s", self._said)
            up.add_metric([], 0.0)
            yield up
            return
        if self._said:
            log.warning("redisync exporter: the store answers again")
            self._said = ""
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _families(self) -> list[Any]:
        g, c = self._new_families()
        errors = GaugeMetricFamily("redisync_run_error", METRICS["redisync_run_error"], labels=["run", "reason"])
        runs = self.runs or tuple(self._server.run_names())
        for run in set(self._stores) - set(runs):  # a run deleted since: its client goes too
            self._stores.pop(run)[1].close()
        for run in runs:
            mine_g, mine_c = self._new_families()
            try:
                self._run(self._store_of(run), mine_g, mine_c)
            except Exception as e:  # one run's failure, whatever it is, is that run's error
                if not self._answers():
                    raise  # the store itself: redisync_store_up 0
                self._said_of(run, e)
                errors.add_metric([run, type(e).__name__], 1.0)
                continue
            for mine, into in ((mine_g, g), (mine_c, c)):
                for name, family in mine.items():
                    into[name].samples.extend(family.samples)
        return [errors, *g.values(), *c.values()]

    def _answers(self) -> bool:
        """Whether the store answers a PING now (a run's failure is then the run's, not the store's)."""
        try:
            self._server.ping()
        except (RedisyncError, ServerError, OSError):
            return False
        return True

    def _said_of(self, run: str, e: BaseException) -> None:
        text = f"{run}: {type(e).__name__}: {e}"
        if text not in self._run_errors:
            self._run_errors.add(text)
            log.warning("redisync exporter: run %r could not be described: %s: %s", run, type(e).__name__, e)

    def _store_of(self, run: str) -> Store:
        """A store per run, kept (a scrape opens no connection pool) until the run's epoch changes: a
        run registered again may hold another schema."""
        epoch = self._server.run_epoch(run)
        if run not in self._stores or self._stores[run][0] != epoch:
            if run in self._stores:
                self._stores[run][1].close()
            self._stores[run] = (epoch, self._connect(run))
        return self._stores[run][1]

    @staticmethod
    def _new_families() -> tuple[dict[str, GaugeMetricFamily], dict[str, CounterMetricFamily]]:
        g = {
            name: GaugeMetricFamily(name, help, labels=labels)
            for name, help, labels in (
                ("redisync_run_fleet_version", METRICS["redisync_run_fleet_version"], ["run"]),
                ("redisync_run_updated_age_seconds", METRICS["redisync_run_updated_age_seconds"], ["run"]),
                ("redisync_run_dead_letters", METRICS["redisync_run_dead_letters"], ["run"]),
                ("redisync_run_shards", METRICS["redisync_run_shards"], ["run", "state"]),
                ("redisync_shard_lease_state", METRICS["redisync_shard_lease_state"], ["run", "shard", "state"]),
                ("redisync_shard_report_age_seconds", METRICS["redisync_shard_report_age_seconds"], ["run", "shard"]),
                ("redisync_shard_versions_behind", METRICS["redisync_shard_versions_behind"], ["run", "shard"]),
                ("redisync_shard_unsynced_tv", METRICS["redisync_shard_unsynced_tv"], ["run", "shard", "key"]),
                ("redisync_shard_sampled_tv", METRICS["redisync_shard_sampled_tv"], ["run", "shard", "key"]),
                ("redisync_shard_measured_tv", METRICS["redisync_shard_measured_tv"], ["run", "shard", "key"]),
                ("redisync_slot_stale", METRICS["redisync_slot_stale"], ["run", "shard", "key"]),
            )
        }
        c = {
            name: CounterMetricFamily(name, METRICS[name], labels=["run", "key"])
            for name in ("redisync_key_dropped_lapsed", "redisync_key_dropped_stale", "redisync_key_retired_departed")
        }
        return g, c

    def _run(self, store: Store, g: dict[str, GaugeMetricFamily], c: dict[str, CounterMetricFamily]) -> None:
        run = store.run
        now = store.server_time_us()
        about = describe_run(store, dead_letters=0)
        g["redisync_run_fleet_version"].add_metric([run], about["fleet_version"])
        if about["updated_age_s"] is not None:
            g["redisync_run_updated_age_seconds"].add_metric([run], about["updated_age_s"])
        g["redisync_run_dead_letters"].add_metric([run], about["dead_letters"])
        leases = shard_leases(store, self._service.setdefault(run, ServiceWatch()))
        for state in LEASE_STATES:
            g["redisync_run_shards"].add_metric([run, state], sum(s == state for s in leases.values()))
        for shard, lease in sorted(leases.items()):
            for state in LEASE_STATES:
                g["redisync_shard_lease_state"].add_metric([run, str(shard), state], float(lease == state))
        reports = shard_reports(store, now)
        for shard, row in sorted(reports.items()):
            g["redisync_shard_report_age_seconds"].add_metric([run, str(shard)], row["age_s"])
            if row["behind"] is not None:
                g["redisync_shard_versions_behind"].add_metric([run, str(shard)], row["behind"])
        drifts = drift(store)
        if self._sampled.get(run, ("",))[0] != about["epoch"]:  # a new epoch's versions start over
            self._sampled[run] = (about["epoch"], SampledDistance())
        sampled = self._sampled[run][1]
        sampled.observe(about["fleet_version"], drifts)
        for key, d in drifts.items():
            if d["kind"] != "distribution":
                continue
            for shard, row in sorted(d["shards"].items()):
                g["redisync_shard_unsynced_tv"].add_metric([run, str(shard), key], row["tv"])
                seen = reports.get(shard, {}).get("seen")
                tv = sampled.distance(key, shard, seen, drifts)
                if tv is not None:
                    g["redisync_shard_sampled_tv"].add_metric([run, str(shard), key], tv)
        for key, shards in measured_drift(store).items():
            for shard, tv in sorted(shards.items()):
                g["redisync_shard_measured_tv"].add_metric([run, str(shard), key], tv)
        for row in about["keys"]:
            for slot in row.get("slots", ()):  # (merge keys: only a key with stale_after_s has stale slots)
                g["redisync_slot_stale"].add_metric([run, str(slot["shard"]), row["key"]], float(slot["stale"]))
            if "dropped_lapsed" in row:
                c["redisync_key_dropped_lapsed"].add_metric([run, row["key"]], row["dropped_lapsed"])
                c["redisync_key_dropped_stale"].add_metric([run, row["key"]], row["dropped_stale"])
                c["redisync_key_retired_departed"].add_metric([run, row["key"]], row["retired_departed"])
