"""Every Redis key name redisync uses, in one place.

All keys of a run share the hash tag ``{run}`` so that a run lives in one Redis Cluster
slot and every script touches one slot.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import InvalidSchema

ROOT = "redisync"
_RUN_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True)
class RunKeys:
    """Key names of one run.

    - ``meta``: hash, run metadata (epoch, fleet_version, schema, limits, times; ``subruns`` when the
      run is split over several primaries).
    - ``shards``: hash, per shard ``<id>:incarnation``, ``<id>:seq``, ``<id>:at``.
    - ``key_meta(name)``: hash, readable metadata of one synced key (spec, version, writers, slots).
    - ``key_data(name)``: hash, the key's float64 vectors (``agg``, ``slot:<id>``, ``retired``, ``value``).
    - ``lease_ends``: sorted set, each leased shard id scored by when its lease ends (the served clock);
      ``gave_up``: sorted set, each shard id that gave its lease up, scored by the run's count of
      give-ups (``gave_up_seq`` in the meta): the indexes by which a fold finds the shards that left.
    - ``written(name)``: sorted set, a state key's writers scored by when each last wrote it.
    - ``reports`` / ``dead_letters``: streams of accepted and rejected reports.
    - ``channel``: pub/sub channel on which every applied fold announces the new fleet version.
    """

    run: str

    def __post_init__(self) -> None:
        if not _RUN_NAME.match(self.run):
            raise InvalidSchema(
                f"run name {self.run!r} must be 1-128 characters of letters, digits, '_', '.', ':' or '-'"
            )

    @functools.cached_property
    def prefix(self) -> str:
        """The prefix every key of the run shares: ``redisync:{run}:``."""
        return f"{ROOT}:{{{self.run}}}:"

    @property
    def meta(self) -> str:
        """The run's metadata hash."""
        return self.prefix + "meta"

    @property
    def shards(self) -> str:
        """The hash of each shard's incarnation, sequence, lease and report times."""
        return self.prefix + "shards"

    @property
    def lease_ends(self) -> str:
        """The index of the shards' lease ends (a sorted set)."""
        return self.prefix + "lease_ends"

    @property
    def gave_up(self) -> str:
        """The index of the shards that gave their lease up, in order (a sorted set)."""
        return self.prefix + "gave_up"

    def written(self, name: str) -> str:
        """The index of a state key's writers by when each last wrote it (a sorted set)."""
        return self.prefix + "written:" + name

    @property
    def reports(self) -> str:
        """The stream of accepted reports."""
        return self.prefix + "reports"

    @property
    def dead_letters(self) -> str:
        """The stream of rejected reports with their reasons."""
        return self.prefix + "dead"

    @property
    def channel(self) -> str:
        """The channel on which each new fleet version is announced."""
        return self.prefix + "versions"

    def key_meta(self, name: str) -> str:
        """A key's metadata hash."""
        return self.prefix + "key:" + name

    def key_data(self, name: str) -> str:
        """A key's data hash: its vectors (aggregate, slots, retired history) or its value."""
        return self.prefix + "data:" + name

    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every key of this run (braces escaped for glob)."""
        return f"{ROOT}:\\{{{self.run}\\}}:*"


def run_of(key: str) -> str | None:
    """The run name a redisync key belongs to, or None for a foreign key."""
    m = re.match(rf"^{ROOT}:\{{([^}}]+)\}}:", key)
    return m.group(1) if m else None
