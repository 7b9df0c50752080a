"""Run administration: register a run, split it, save and restore it, delete it."""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from typing_extensions import Self

from .. import errors
from .codec import as_text
from .connection import Connection, _translated, server_time_us
from .keys import RunKeys
from .schema import Limits, Schema
from .semantics.base import first_error


@dataclass(frozen=True)
class Registration:
    """What `Store.register` found: whether this call created the run, and the run's epoch."""

    created: bool
    epoch: str


class RunSnapshot(BaseModel):
    """A whole run, for a training checkpoint or a move between servers (JSON-safe, versioned).

    ``hashes`` maps each run hash (by its suffix after ``redisync:{run}:``) to its fields,
    every value base64 encoded since vectors are raw float64 bytes.
    """

    model_config = ConfigDict(extra="forbid")

    format: str = "redisync.snapshot"
    format_version: int = 1
    run: str
    taken_at_us: int
    hashes: dict[str, dict[str, str]]


def _checked_snapshot(snap: RunSnapshot) -> tuple[dict[str, dict[str, bytes]], Schema]:
    """The snapshot's hashes decoded, and its schema, after checking every hash and vector."""
    if snap.format != "redisync.snapshot" or snap.format_version != 1:
        raise errors.CorruptSnapshot(f"unsupported snapshot format {snap.format} v{snap.format_version}")

    def bad(where: str, what: str) -> errors.CorruptSnapshot:
        return errors.CorruptSnapshot(f"snapshot of run {snap.run!r}, {where}: {what}")

    hashes: dict[str, dict[str, bytes]] = {}
    for name, fields in snap.hashes.items():
        try:
            hashes[name] = {k: base64.b64decode(v, validate=True) for k, v in fields.items()}
        except ValueError:
            raise bad(f"hash {name!r}", "a field value is not base64") from None
    meta = hashes.get("meta")
    if not meta or "schema" not in meta or "digest" not in meta:
        raise bad("hash 'meta'", "missing, or without its schema and digest")
    try:
        schema = Schema.model_validate_json(meta["schema"])
    except ValueError as e:
        raise bad("the schema", str(e).splitlines()[0]) from None
    if as_text(meta["digest"]) != schema.digest:
        raise bad("hash 'meta'", "the digest does not match the schema")
    for field in ("fleet_version", "max_report_bytes", "stream_maxlen", "dead_letter_maxlen"):
        if not as_text(meta.get(field, b"")).isdigit():
            raise bad("hash 'meta'", f"{field} is missing or not a whole number")
    # the limits as the fold reads them, made from the fields beside it (a snapshot taken before the
    # field existed has none)
    dead_bytes = as_text(meta.get("dead_letter_max_bytes", b""))
    packed = as_text(meta.get("limits", b""))
    stall = Limits.unpacked(packed).stall_after_s if re.fullmatch(r"(\d+\|){5}\d+", packed) else None
    try:
        meta["limits"] = (
            Limits(
                max_report_bytes=int(meta["max_report_bytes"]),
                stream_maxlen=int(meta["stream_maxlen"]),
                dead_letter_maxlen=int(meta["dead_letter_maxlen"]),
                stream_payloads=as_text(meta.get("stream_payloads", b"0")) == "1",
                **({"dead_letter_max_bytes": int(dead_bytes)} if dead_bytes.isdigit() else {}),
                **({"stall_after_s": stall} if stall is not None else {}),
            )
            .packed()
            .encode()
        )
    except ValidationError as e:
        raise bad("hash 'meta'", f"the limits: {first_error(e)}") from None
    expected = {"meta", "shards"} | {f"{kind}:{name}" for name in schema.keys for kind in ("key", "data")}
    if set(hashes) - expected:
        raise bad("the hashes", f"unknown hashes {sorted(set(hashes) - expected)}")
    for name, spec in schema.keys.items():
        info = {k: as_text(v) for k, v in hashes.get(f"key:{name}", {}).items()}
        data = hashes.setdefault(f"data:{name}", {})
        if (
            info.get("semantics") != spec.semantics
            or info.get("width") != str(spec.width)
            or not info.get("version", "").isdigit()
        ):
            raise bad(f"key {name!r}", "its metadata is missing or does not match the schema")
        key_info = hashes[f"key:{name}"]
        for field, declared in spec.meta_fields(name).items():
            if field in info and info[field] != declared:
                raise bad(f"key {name!r}", f"{field} is {info[field]!r}, the snapshot's schema declares {declared!r}")
            key_info[field] = declared.encode()  # (an older snapshot without the field: the schema's)
        spec.check_stored(name, key_info, data, bad)
    return hashes, schema


class RunAdmin(Connection):
    """A run's administration: its registration, its split into sub-runs, its snapshots and its deletion."""

    def sibling(self, run: str) -> Self:
        """Another run on the same server, through the same connections and settings."""
        other = type(self)(self.redis, run)
        other.url = self.url
        other.wait_replicas, other.wait_timeout_ms, other.connect_args = (
            self.wait_replicas,
            self.wait_timeout_ms,
            self.connect_args,
        )
        return other

    @_translated
    def subruns(self) -> list[str]:
        """The sub-runs of this run when it is split over several primaries (`split`), in order;
        empty for a run that is not split (one HGET, which every role may run)."""
        names = self.redis.hget(self.keys.meta, "subruns")
        return list(as_text(names).split(",")) if names else []

    @_translated
    def split(self, names: Sequence[str]) -> list[str]:
        """Split this run into the sub-runs ``names`` (shard ``k`` publishes to ``names[k % len]``),
        unless it is split already: returns the split in force, which never changes in the run's
        life. An aggregator per sub-run (`redisync.aggregation.Aggregator`) makes this run the sum
        of them; a split is made before the run's collectors start."""
        if not names:
            raise errors.ConfigurationError(f"run {self.run!r}: a split needs at least one sub-run")
        for name in names:
            RunKeys(name)  # a bad name: InvalidSchema, before anything is written
        if len(set(names)) != len(names) or self.run in names:
            raise errors.ConfigurationError(f"run {self.run!r}: sub-runs must differ from each other and from it")
        in_force: list[str] = self.subruns()
        if in_force:
            return in_force
        if self.registered():
            raise errors.ConfigurationError(
                f"run {self.run!r} is registered already and not split (its collectors publish to it): split a run "
                "before its collectors start, or name a new one"
            )
        self.redis.hsetnx(self.keys.meta, "subruns", ",".join(names))
        split: list[str] = self.subruns()
        return split

    @_translated
    def shard_ids(self) -> set[int]:
        """Every shard id that has claimed or folded in the run's current life."""
        fields = (as_text(f) for f in self.redis.hkeys(self.keys.shards))
        return {int(f[: -len(":incarnation")]) for f in fields if f.endswith(":incarnation")}

    def home(self, shard_id: int) -> Self:
        """Where shard ``shard_id`` publishes: this run, or its sub-run when the run is split."""
        names = self.subruns()
        return self.sibling(names[shard_id % len(names)]) if names else self

    @_translated
    def registered(self) -> bool:
        """Whether the run is registered on the server (one HGET, which every role may run)."""
        return self.redis.hget(self.keys.meta, "epoch") is not None

    def register(self, schema: Schema | Mapping[str, Any], limits: Limits | None = None) -> Registration:
        """Store the run's schema (the first registration wins) or check ours against it.

        Args:
            schema: ``{key: spec}`` (`merge`, `broadcast`, `maximum`) or a
                `Schema`.
            limits: the run's size limits (`Limits`; the defaults suit fleet reports).

        Raises:
            SchemaMismatch: the run holds another schema, naming the key that differs.
        """
        schema = schema if isinstance(schema, Schema) else Schema.of(schema)
        limits = limits or Limits()
        args: list[Any] = [
            schema.canonical_json(),
            schema.digest,
            secrets.token_hex(8),
            limits.packed(),
            limits.announce_every_us,
        ]
        for name, spec in schema.keys.items():
            meta, data = spec.meta_fields(name) | spec.initial_meta(), spec.initial_data()
            args += [name, spec.semantics, len(meta), len(data)]
            args += [x for pair in meta.items() for x in pair] + [x for pair in data.items() for x in pair]
        reply = self._call(self.scripts.register, self._key_hashes(schema), args)
        if as_text(reply[0]) == "unknown_semantics":
            raise errors.InvalidSchema(
                f"key {as_text(reply[1])!r}: {as_text(reply[2])} (a newer redisync registered it?)"
            )
        if as_text(reply[0]) == "no_info":
            raise errors.PermissionDenied(
                f"{self.url}, run {self.run!r}: this role may not run INFO ({as_text(reply[1])}); redisync needs it to tell a "
                "restarted server from the same one (a restart that lost writes opens a new epoch): grant +info "
                "(deploy/users.acl does)"
            )
        status, epoch, registered = reply
        if as_text(status) == "mismatch":
            theirs = Schema.model_validate_json(registered)
            key, difference = schema.difference(theirs) or (None, "schema digest differs")
            raise errors.SchemaMismatch(key, difference)
        self._adopt(schema)
        return Registration(created=as_text(status) == "created", epoch=as_text(epoch))

    def _hash_names(self) -> list[str]:
        return ["meta", "shards"] + [f"{kind}:{name}" for name in self.schema.keys for kind in ("key", "data")]

    @_translated
    def snapshot(self) -> RunSnapshot:
        """The whole run's state, read in one transaction."""
        names = self._hash_names()
        pipe = self.redis.pipeline(transaction=True)
        for n in names:
            pipe.hgetall(self.keys.prefix + n)
        hashes = pipe.execute()
        if not hashes[0]:
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        return RunSnapshot(
            run=self.run,
            taken_at_us=server_time_us(self.redis),
            hashes={
                n: {as_text(k): base64.b64encode(v).decode() for k, v in h.items()}
                for n, h in zip(names, hashes, strict=False)
            },
        )

    @_translated
    def restore(self, snap: RunSnapshot) -> str:
        """Replace the run's state by ``snap`` under a new epoch, atomically; returns the epoch.

        Every hash and vector is checked before anything is written (a bad snapshot raises
        `CorruptSnapshot` and leaves the run as it was). Versions continue
        from the larger of the current and the snapshot's, so no client ever sees a version go back;
        the new epoch tells every client to take the full state. Shards the run knows keep their
        current incarnation, so live collectors keep publishing: a slot of theirs from another
        incarnation in the snapshot is their previous life (retired or dropped by the key's
        lifecycle, or taken over on resume) at their next fold.
        """
        hashes, schema = _checked_snapshot(snap)
        self._adopt(schema)
        names = self._hash_names()
        args: list[Any] = [secrets.token_hex(8)]
        for n in names:
            fields = hashes.get(n, {})
            args.append(len(fields))
            for k, v in fields.items():
                args += [k, v]
        self._call(self.scripts.restore, [self.keys.prefix + n for n in names], args)
        return as_text(args[0])

    @_translated
    def delete(self) -> int:
        """Remove every key of the run (its state, streams and metadata)."""
        doomed = list(self.redis.scan_iter(match=self.keys.pattern, count=1000))
        return int(self.redis.delete(*doomed)) if doomed else 0
