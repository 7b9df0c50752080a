"""The store: key names, schemas and their validation, the fold's specification, the wire codec, and
the one client that talks to Redis (the Lua scripts in ``lua/``). It imports neither the collector
runtime nor torch."""

from .client import RunSnapshot, ShardClient, Store, connect, serve_embedded

__all__ = ["RunSnapshot", "ShardClient", "Store", "connect", "serve_embedded"]
