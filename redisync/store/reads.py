"""What an observer reads of a run: its leases, its keys' metadata and vectors, its streams, its shards.

Read-only calls (an inspector's role may make every one), for `redisync.inspection`, the exporter,
``redisync watch`` and the learner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import errors
from .codec import as_text
from .connection import Connection, _translated


@dataclasses.dataclass(frozen=True)
class LeaseReading:
    """A run's leases as an observer reads them (``leases.lua``): the server's time, the run's served
    clock (clock.lua's, not advanced by the read), the server's time at the run's last call, the
    stall cap, each shard's lease end in the served clock (-1: given up) and, for a shard that gave
    its lease up, why (`lifeline.stop_cause`: ``clean``, ``parent_exited``, ``terminated``)."""

    now_us: int
    served_us: int
    last_call_us: int | None
    stall_cap_us: int
    alive_until_us: dict[int, int]
    stopped: dict[int, str]


class InspectionReads(Connection):
    """An observer's reads of a run."""

    @_translated
    def leases(self) -> LeaseReading:
        """The run's leases as the fold judges them, read without advancing its served clock (an
        observer's read: the inspector role may make it)."""
        reply = self._call_read_only(self.scripts.leases, [self.keys.shards, self.keys.meta], [])
        if as_text(reply[0]) == "no_run":
            raise errors.RunNotFound(f"run {self.run!r} is not registered")
        now, served, wall, cap = (as_text(v) for v in reply[1:5])
        rows = [as_text(v) for v in reply[5:]]
        triples = [rows[i : i + 3] for i in range(0, len(rows), 3)]
        return LeaseReading(
            now_us=int(now),
            served_us=int(served),
            last_call_us=int(wall) if wall else None,
            stall_cap_us=int(cap),
            alive_until_us={int(shard): int(until) for shard, until, _ in triples},
            stopped={int(shard): why for shard, until, why in triples if int(until) < 0 and why},
        )

    @_translated
    def key_info(self, name: str) -> dict[str, str]:
        """The readable metadata of one key (what ``redis-cli HGETALL`` shows)."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.key_meta(name)).items()}

    @_translated
    def key_vectors(self, name: str) -> dict[str, bytes]:
        """The stored vectors of one key (its data hash: what its semantics' module reads)."""
        data = self.redis.hgetall(self.keys.key_data(name))
        return {as_text(k): v for k, v in data.items() if isinstance(v, bytes)}

    @_translated
    def run_info(self) -> dict[str, str]:
        """The run's metadata hash: epoch, fleet version, times."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.meta).items()}

    @_translated
    def dead_letters(self, count: int = 100) -> list[dict[str, Any]]:
        """The newest rejected reports, newest first, with reason, key and detail as text."""
        out = []
        for entry_id, fields in self.redis.xrevrange(self.keys.dead_letters, count=count) or []:
            row: dict[str, Any] = {"id": as_text(entry_id)}
            for k, v in (fields or {}).items():
                k = as_text(k)
                row[k] = v if k.startswith("report:") else as_text(v)
            out.append(row)
        return out

    @_translated
    def key_fields(self, name: str, fields: Sequence[str]) -> list[Any]:
        """Fields of key ``name``'s data hash (what its semantics' ``describe`` asks for), in order."""
        return list(self.redis.hmget(self.keys.key_data(name), list(fields))) if fields else []

    @_translated
    def stream_lengths(self) -> tuple[int, int]:
        """The lengths of the run's reports stream and of its dead-letter stream."""
        return int(self.redis.xlen(self.keys.reports)), int(self.redis.xlen(self.keys.dead_letters))

    @_translated
    def dead_letter_count(self) -> int:
        """The length of the run's dead-letter stream: reports refused and kept."""
        return int(self.redis.xlen(self.keys.dead_letters))

    @_translated
    def shards_info(self) -> dict[str, str]:
        """The run's shards hash (``<shard>:<field>``: incarnation, seq, at_us, seen, made, lease), as text."""
        return {as_text(k): as_text(v) for k, v in self.redis.hgetall(self.keys.shards).items()}
