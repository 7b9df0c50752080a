"""Every error redisync raises, under one root so callers can catch them all.

Validation errors (bad reports, bad schemas) also subclass ``ValueError`` so that code
written against plain Python conventions still catches them. Server-side rejections carry
the machine-readable ``reason`` code the fold script wrote to the dead-letter stream.
"""

from __future__ import annotations

from typing import Any


class RedisyncError(Exception):
    """Root of every redisync error."""


class ConnectionUnavailable(RedisyncError):
    """The store could not be reached (the URL is wrong or the server is down)."""


class NotReplicated(ConnectionUnavailable):
    """A fold was applied on the primary but fewer replicas than required acknowledged it in time;
    it may be lost in a failover, so the caller should publish again (reports are cumulative)."""


class UnsupportedServer(ConnectionUnavailable):
    """The server lacks what redisync needs (Redis Functions: Redis 7.0 or later, or Valkey)."""


class FunctionsMissing(ConnectionUnavailable):
    """redisync's functions of this version vanished from the server right after being loaded."""


class ConfigurationError(RedisyncError, ValueError):
    """An argument that cannot work (an unknown worker, a process worker without a Redis URL)."""


class PermissionDenied(RedisyncError):
    """The server refused the credentials or the command (ACL: NOPERM, WRONGPASS)."""


class ShardInUse(RedisyncError):
    """Another live process holds this shard id (its lease is fresh): two collectors were started
    with one shard id. Give each its own (``REDISYNC_SHARD``), or pass ``take_over=True`` to make
    this process the shard's new life (the other one is then refused as a zombie)."""

    def __init__(self, shard_id: int, incarnation: str, remaining_ms: int):
        self.shard_id, self.incarnation, self.remaining_ms = shard_id, incarnation, remaining_ms
        super().__init__(
            f"shard {shard_id} is held by a live process (incarnation {incarnation}, lease renewed "
            f"{remaining_ms} ms ahead): give each collector its own shard id (set REDISYNC_SHARD, or run under "
            "torchrun), or pass take_over=True to replace it"
        )

    def __reduce__(self) -> Any:
        return (ShardInUse, (self.shard_id, self.incarnation, self.remaining_ms))


class Fenced(RedisyncError):
    """A later process has claimed this process's shard: it must stop, its reports would be refused
    (an aggregator replaced by another one for the same sub-run)."""


class RunNotFound(RedisyncError):
    """The run has no state in the store: never registered, or the store lost it (new epoch)."""


class SchemaMismatch(RedisyncError, ValueError):
    """The client's schema differs from the one registered for the run."""

    def __init__(self, key: str | None, difference: str):
        self.key = key
        self.difference = difference
        where = f"key {key!r}: " if key else ""
        super().__init__(f"schema mismatch: {where}{difference}")


class CorruptSnapshot(RedisyncError, ValueError):
    """A snapshot file or object that is not a readable redisync snapshot."""


class InvalidSchema(RedisyncError, ValueError):
    """A schema or key spec is malformed (bad key name, shape, owner, option)."""


class InvalidReport(RedisyncError, ValueError):
    """A report was refused. ``key`` names the offending key (None for the envelope).

    Raised on the client before anything is sent, or by the server when a client skipped
    validation; ``reason`` is the same code in both places.
    """

    reason = "invalid"

    def __init__(self, key: str | None, detail: str, *, reason: str | None = None):
        self.key = key
        self.detail = detail
        if reason is not None:
            self.reason = reason
        where = f"key {key!r}" if key else "report"
        super().__init__(f"{where}: {detail} [{self.reason}]")


class MalformedReport(InvalidReport):
    """Wrong types, missing or extra fields, unparsable envelope values."""

    reason = "malformed"


class UnknownKey(InvalidReport):
    """The report names a key the run's schema does not declare."""

    reason = "unknown_key"


class ShapeMismatch(InvalidReport):
    """An array does not have (or broadcast to) the key's declared shape or byte length."""

    reason = "shape"


class NonFiniteValue(InvalidReport):
    """An array holds NaN or ±inf."""

    reason = "non_finite"


class NegativeValue(InvalidReport):
    """A count or a sum of squares is negative."""

    reason = "negative"


class PayloadTooLarge(InvalidReport):
    """The report exceeds the configured size limit."""

    reason = "too_large"


class NotOwner(InvalidReport):
    """A shard wrote a broadcast key owned by another shard."""

    reason = "not_owner"


class StaleIncarnation(InvalidReport):
    """A report from an incarnation older than the shard's current one (a zombie process)."""

    reason = "stale_incarnation"


class SeqRollback(InvalidReport):
    """A report whose sequence number is lower than one already folded for its incarnation."""

    reason = "seq_rollback"


class CorruptState(InvalidReport):
    """The run's stored state is damaged (a vector of the wrong length, a missing slot or hash, a key
    of the wrong type): the fold refused to touch it. Restore a snapshot or delete the run."""

    reason = "corrupt_state"


class SchemaDigestMismatch(InvalidReport):
    """The server refused a report made against a different schema."""

    reason = "schema_mismatch"


_BY_REASON: dict[str, type[InvalidReport]] = {
    cls.reason: cls
    for cls in (
        MalformedReport,
        UnknownKey,
        ShapeMismatch,
        NonFiniteValue,
        NegativeValue,
        PayloadTooLarge,
        NotOwner,
        StaleIncarnation,
        SeqRollback,
        SchemaDigestMismatch,
        CorruptState,
    )
}


def rejection(reason: str, key: str | None, detail: str) -> InvalidReport:
    """The typed error for a server-side rejection code."""
    cls = _BY_REASON.get(reason, InvalidReport)
    return cls(key or None, detail, reason=reason)
