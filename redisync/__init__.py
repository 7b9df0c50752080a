"""redisync: a Redis-backed, versioned fleet state store for the collectors of a distributed RL trainer."""

from .collector.settings import SyncSettings
from .collector.syncer import Syncer
from .collector.workers import new_syncer
from .errors import RedisyncError
from .store.client import RunSnapshot, ShardClient, Store, connect
from .store.codec import KeyView, PublishResult, PullResult
from .store.schema import (
    BroadcastReport,
    Limits,
    MaximumReport,
    MergeReport,
    MinimumReport,
    Schema,
    broadcast,
    maximum,
    merge,
    minimum,
)

__all__ = [
    "BroadcastReport",
    "KeyView",
    "Limits",
    "MaximumReport",
    "MergeReport",
    "MinimumReport",
    "PublishResult",
    "PullResult",
    "RedisyncError",
    "RunSnapshot",
    "Schema",
    "ShardClient",
    "Store",
    "SyncSettings",
    "Syncer",
    "broadcast",
    "connect",
    "maximum",
    "merge",
    "minimum",
    "new_syncer",
]
__version__ = "0.1.0"
