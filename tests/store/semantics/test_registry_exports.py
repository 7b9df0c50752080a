"""Every semantics in the registry is exported alike: its builder from `redisync.store.schema` and
`redisync`, its spec and report classes from `redisync.store.semantics` (minimum was missing)."""

from __future__ import annotations

import redisync
from redisync.store import schema, semantics


def test_every_registered_semantics_is_exported_by_the_schema_the_semantics_and_the_package():
    """For each name in the registry: its builder in schema and redisync, its Spec and Report classes in both __all__."""
    for name in semantics.NAMES:
        title = name.capitalize()
        assert name in schema.__all__, name
        assert callable(getattr(schema, name)), name
        assert getattr(redisync, name) is getattr(schema, name), name
        for kind in ("Spec", "Report"):
            assert f"{title}{kind}" in semantics.__all__, (name, kind)
            assert getattr(schema, f"{title}{kind}") is getattr(semantics, f"{title}{kind}"), (name, kind)
        assert semantics.SEMANTICS[name] is getattr(semantics, f"{title}Spec")
