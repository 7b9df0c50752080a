"""Every Redis key of a run carries the run's hash tag (one Cluster slot: every script touches one
slot), the names the Lua makes are the ones `RunKeys` gives, and `run_of` reads the run back."""

from __future__ import annotations

import re

import pytest

from redisync.errors import InvalidSchema
from redisync.store.keys import RunKeys, run_of


def _every_name(keys: RunKeys) -> list[str]:
    return [
        keys.meta, keys.shards, keys.reports, keys.dead_letters, keys.channel, keys.lease_ends, keys.gave_up,
        keys.key_meta("motion/bin_failed"), keys.key_data("motion/bin_failed"), keys.written("motion/bin_failed"),
    ]  # fmt: skip


def test_every_key_of_a_run_shares_its_hash_tag_and_names_its_run():
    """Each name starts with the run's prefix, its hash tag is the run's name, and `run_of` gives it back."""
    keys = RunKeys("humanoid-v3.a:1")
    for name in _every_name(keys):
        assert name.startswith(keys.prefix), name
        assert re.search(r"\{([^}]*)\}", name).group(1) == "humanoid-v3.a:1"
        assert run_of(name) == "humanoid-v3.a:1"
    assert len(set(_every_name(keys))) == len(_every_name(keys))  # no two concepts share a name
    assert run_of("someone-else:key") is None


def test_the_lua_makes_the_index_names_the_python_gives():
    """fold.lua and lease.lua make the liveness indexes' names from the run's prefix: the same strings
    as `RunKeys` (a mismatch would leave every state key judging an empty index)."""
    from importlib.resources import files

    lua = files("redisync.store").joinpath("lua")
    fold, lease = lua.joinpath("fold.lua").read_text(), lua.joinpath("lease.lua").read_text()
    keys = RunKeys("r")
    assert f"lease_ends = p .. '{keys.lease_ends.removeprefix(keys.prefix)}'" in fold
    assert f"gave_up = p .. '{keys.gave_up.removeprefix(keys.prefix)}'" in fold
    assert f"written = p .. '{keys.written('').removeprefix(keys.prefix)}'" in fold
    assert f"prefix .. '{keys.lease_ends.removeprefix(keys.prefix)}'" in lease
    assert f"prefix .. '{keys.gave_up.removeprefix(keys.prefix)}'" in lease


@pytest.mark.parametrize("bad", ["", "a b", "x{y}", "a" * 129, "ünï"])
def test_a_run_name_outside_its_alphabet_is_refused(bad):
    """A run name is 1-128 letters, digits, '_', '.', ':' or '-' (a brace would break the hash tag)."""
    with pytest.raises(InvalidSchema, match="run name"):
        RunKeys(bad)
