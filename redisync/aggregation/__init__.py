"""One run over several primaries: sub-runs, and an aggregator per sub-run that makes them one fleet."""

from .aggregator import OUTSIDE_SHARD, ROOT_SHARD_BASE, Aggregator, Round
from .layout import split, subrun_names

__all__ = ["OUTSIDE_SHARD", "ROOT_SHARD_BASE", "Aggregator", "Round", "split", "subrun_names"]
