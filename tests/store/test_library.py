"""The store's Redis Functions library: loaded where it is missing or of another version, refused
with a typed error by a server too old to hold it, and the same text on both backends."""

from __future__ import annotations

import uuid

import fakeredis
import pytest

import redisync
from redisync import errors
from redisync.store.client import Store
from redisync.store.library import FUNCTIONS, Library
from redisync.store.schema import Schema, broadcast, merge

SCHEMA = Schema.of({"obs/norm": merge(2, lifecycle="history"), "curriculum/scale": broadcast(())})


@pytest.fixture(scope="module")
def own_url(tmp_path_factory):
    """A redis-server of this module's own: its tests FUNCTION FLUSH and prune, server-wide commands
    that would remove every other test worker's library from a shared server."""
    from tests.servers import RedisProcess

    server = RedisProcess(tmp_path_factory.mktemp("library")).start()
    yield server.url
    server.stop()


@pytest.fixture
def make_store(backend, own_url):
    """Fresh runs on the embedded store or on this module's own server (never the shared one)."""
    made: list[Store] = []

    def make(run: str | None = None) -> Store:
        store = redisync.connect(own_url if backend == "real" else None, run=run or f"t-{uuid.uuid4().hex[:12]}")
        made.append(store)
        return store

    yield make
    for store in made:
        store.delete()
        store.close()


def _loaded(store: Store) -> set[str]:
    """The names of the functions of every redisync library on the server."""
    out = set()
    for library in store.redis.function_list(library="redisync*"):
        fields = dict(zip(library[::2], library[1::2], strict=True))
        out |= {dict(zip(f[::2], f[1::2], strict=True))[b"name"].decode() for f in fields[b"functions"]}
    return out


def test_a_library_of_another_version_stays_beside_ours(make_store):
    """Two redisync versions on one server (a rolling upgrade, two teams): loading ours removes
    nothing of the other's, and each calls its own functions."""
    store = make_store()
    theirs = {f"redisync_{f}_0ld" for f in FUNCTIONS}
    Library(store.redis, version="0ld").load()  # what another redisync version loaded on the server
    assert theirs <= _loaded(store)
    store.register(SCHEMA)
    store.shard(0).publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})
    ours = {f"redisync_{f}_{store.scripts.version}" for f in FUNCTIONS}
    assert theirs | ours <= _loaded(store)
    assert store.fleet().keys["obs/norm"].parts()["count"] == 1
    assert {"0ld", store.scripts.version} <= {lib.version for lib in store.functions()}
    # retiring the old version deletes its library only
    assert "redisync_0ld" in store.prune_functions()
    assert not theirs & _loaded(store)
    assert ours <= _loaded(store)


def test_a_library_that_vanishes_as_it_is_loaded_is_a_typed_error(make_store, monkeypatch):
    """Every retry path ends in a RedisyncError: a library flushed again right after it was loaded
    (a concurrent prune or FUNCTION FLUSH) is ``FunctionsMissing``, not redis-py's ResponseError."""
    store = make_store()
    store.register(SCHEMA)
    shard = store.shard(0)
    original = store.scripts.load

    def load_then_lose() -> None:
        original()
        store.redis.function_flush()

    store.redis.function_flush()
    monkeypatch.setattr(store.scripts, "load", load_then_lose)
    with pytest.raises(errors.FunctionsMissing, match="missing right after being loaded"):
        shard.publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})
    with pytest.raises(errors.FunctionsMissing):
        store.fleet()


def test_a_flushed_library_is_loaded_again_by_the_next_call_and_nothing_is_lost(make_store):
    """After an operator's FUNCTION FLUSH the next call loads the library again, and nothing of the run is
    lost."""
    store = make_store()
    store.register(SCHEMA)
    shard = store.shard(0)
    shard.publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})
    store.redis.function_flush()  # an operator's FUNCTION FLUSH, or a node that never had it
    assert _loaded(store) == set()
    shard.publish({"obs/norm": {"count": 3, "sum": [1.0, 2.0]}})  # the fold: through a pipeline with WAIT
    store.redis.function_flush()
    assert store.fleet().keys["obs/norm"].parts()["count"] == 3  # the pull: FCALL_RO
    assert store.fleet().fleet_version == 2


def test_a_server_without_functions_is_refused_with_a_typed_error_naming_the_minimum():
    """A server without Redis Functions is UnsupportedServer, naming the minimum version."""
    old = Store(fakeredis.FakeRedis(server=fakeredis.FakeServer(version=(6, 2))), "old-server")
    with pytest.raises(errors.UnsupportedServer, match=r"Redis 7\.0 or later"):
        old.register(SCHEMA)


def test_the_version_is_the_texts_own_digest_so_an_edit_is_a_new_version():
    """A library's version is its text's digest: an edited library is another version, with functions of other
    names."""
    ours = Library(fakeredis.FakeRedis())
    edited = Library(fakeredis.FakeRedis(), edit={"lease.lua": "local function lease() end\nexport('lease', lease)"})
    assert ours.version != edited.version
    assert ours.fold.name == f"redisync_fold_{ours.version}"
    assert ours.text.startswith(f"#!lua name=redisync_{ours.version}\n")  # a library per version


def test_the_server_reads_its_identity_once_per_vm_not_once_per_fold(counted_url):
    """The restart check's INFO ran in every fold of an EVAL script; a library keeps the run_id for
    the life of its VM (a restart starts a fresh one: tests/store/test_reliability.py's AOF restart
    still opens a new epoch)."""
    from redisync import connect

    store = connect(counted_url, run="identity-once")
    try:
        store.register(SCHEMA)
        shard = store.shard(0)
        shard.publish({"obs/norm": {"count": 1, "sum": [1.0, 2.0]}})

        def info_calls() -> int:
            return int(store.redis.info("commandstats").get("cmdstat_info", {}).get("calls", 0))

        before = info_calls()
        for k in range(20):
            shard.publish({"obs/norm": {"count": k + 2, "sum": [1.0, 2.0]}})
        assert info_calls() - before <= 1  # (the first reading of the stats is itself an INFO)
        assert store.fleet().fleet_version == 21
    finally:
        store.delete()


def test_the_library_holds_one_lua_module_per_semantics_of_the_registry():
    """The Lua registry is made from the Python one: every semantics has its module in the library,
    under its name, and nothing else does; the one other Lua file of the folder is what maximum and
    minimum share (``extremum.lua``), the twin of the Python package's ``extremum.py``."""
    import re
    from importlib.resources import files

    from redisync.store import library
    from redisync.store.semantics import SEMANTICS

    text, _ = library.source()
    assert sorted(re.findall(r"SEMANTICS\['(\w+)'\] = \(function\(\)", text)) == sorted(SEMANTICS)
    lua = files("redisync.store").joinpath("lua/semantics")
    assert sorted(p.name for p in lua.iterdir() if p.name.endswith(".lua")) == sorted(
        [f"{s}.lua" for s in SEMANTICS] + ["extremum.lua"]
    )
    assert files("redisync.store").joinpath("semantics/extremum.py").is_file()
    for name, spec in SEMANTICS.items():
        assert spec.model_fields["semantics"].default == name


def test_the_envelope_and_the_functions_name_no_semantics():
    """fold.lua, pull.lua and register.lua find a key's semantics in SEMANTICS by the name its meta
    holds: their code (comments aside) names none, so a new semantics touches none of them."""
    from importlib.resources import files

    from redisync.store.semantics import SEMANTICS

    for path in ("fold.lua", "pull.lua", "register.lua", "shared.lua"):
        text = files("redisync.store").joinpath(f"lua/{path}").read_text()
        code = "\n".join(line.split("--")[0] for line in text.splitlines())
        for name in SEMANTICS:
            assert name not in code, f"{path} names {name!r}"
