"""Which worker a collector's `Syncer` gets: the one decision both worker modules sit below."""

from __future__ import annotations

import platform
from collections.abc import Sequence

from .. import errors
from ..store.client import Store
from .seam import SyncedTerm
from .settings import SyncSettings
from .sidecar import SidecarWorker
from .syncer import Syncer

WORKERS = ("auto", "process", "thread")


def stores_in_order() -> bool:
    """Whether this CPU makes one core's stores visible to the others in program order (x86's TSO)."""
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def new_syncer(
    store: Store,
    shard_id: int,
    terms: Sequence[SyncedTerm],
    *,
    worker: str = "auto",
    publish_every_steps: int = SyncSettings.publish_every_steps,
    publish_every_s: float = SyncSettings.publish_every_s,
    poll_every_s: float = SyncSettings.poll_every_s,
    min_pull_interval_s: float = SyncSettings.min_pull_interval_s,
    retry_every_s: float = SyncSettings.retry_every_s,
    start_timeout_s: float = SyncSettings.start_timeout_s,
    lease_s: float = SyncSettings.lease_s,
    incarnation: int | None = None,
    resume: bool | frozenset[str] | None = None,
    take_over: bool = False,
) -> Syncer:
    """A collector's Syncer: it publishes ``terms``' reports as shard ``shard_id`` of ``store``'s run
    and hands the fleet state to them at reset boundaries, without the collector ever waiting.

    Args:
        store: the run's store (`redisync.connect`).
        shard_id: this collector's shard, unique in the fleet (0, 1, ...).
        terms: the synced terms (samplers, normalisers, curriculum terms) whose state is shared.
        worker: where the network runs. ``"process"``: a sidecar process of its own, which keeps
            the collector's interpreter lock free for its hot path; ``"thread"``: a thread of this
            process; ``"auto"``: the sidecar for a Redis URL, the thread for the embedded store
            (which lives inside this process). Same API, same rules. The sidecar's seqlocks are
            plain stores with no memory fences: they rely on a CPU that keeps stores in order
            (x86); elsewhere ``"auto"`` takes the thread and ``"process"`` is refused.
        publish_every_steps: `redisync.SyncSettings.publish_every_steps` (the settings' one declaration: meaning, default, checks).
        publish_every_s: `redisync.SyncSettings.publish_every_s`.
        poll_every_s: `redisync.SyncSettings.poll_every_s`.
        min_pull_interval_s: `redisync.SyncSettings.min_pull_interval_s`.
        retry_every_s: `redisync.SyncSettings.retry_every_s`.
        start_timeout_s: `redisync.SyncSettings.start_timeout_s`.
        lease_s: `redisync.SyncSettings.lease_s`.
        incarnation: this process's incarnation of the shard (default: claimed from the store at
            ``start()``, one above the last).
        resume: whether the terms resume their own cumulative statistics from a checkpoint (their
            previous life's slots are taken over, not counted twice): ``True``/``False`` for every
            key, a set of key names, or ``None`` to ask each term (``term.resumed``).
        take_over: claim the shard even while another live process holds its lease (a restarted
            collector whose old process is known to be gone).
    """
    settings = SyncSettings.of(locals())  # the settings among the arguments
    if worker not in WORKERS:
        raise errors.ConfigurationError(f"worker must be one of {WORKERS}, got {worker!r}")
    if worker == "auto":
        worker = "process" if getattr(store, "connect_args", None) is not None and stores_in_order() else "thread"
    if worker == "process" and not stores_in_order():
        raise errors.ConfigurationError(
            f"worker='process' needs a CPU that keeps stores in order (x86); this one is {platform.machine()!r}: "
            "use worker='thread'"
        )
    syncer = Syncer(
        store, shard_id, terms, settings=settings, incarnation=incarnation, resume=resume, take_over=take_over
    )
    return syncer.use(SidecarWorker) if worker == "process" else syncer
