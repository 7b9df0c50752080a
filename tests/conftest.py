"""Fixtures: every store test runs on the embedded default AND on a real Redis.

The real server is ``REDISYNC_TEST_URL`` (default: database 9 of 127.0.0.1 on ``REDIS_PORT``, 6379
unset: the port ``scripts/ensure-redis`` starts a server on). It is shared (other workers, checkouts,
redisync versions): every test process runs with the guard of ``tests/guard``, which refuses a
server-wide command there and fails the test that sent it. Each test
gets a run of its own, deleted afterwards. When ``REDISYNC_REQUIRE_REDIS=1`` (set by
``scripts/test`` and so by CI) an unreachable server fails the tests instead of skipping them;
``REDISYNC_REQUIRE_FRAMEWORKS=1`` does the same for the frameworks tier's mjlab, rsl_rl and holosoma.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import redisync
from redisync.store.client import Store

REDIS_PORT = int(os.environ.get("REDIS_PORT") or 6379)
REAL_URL = os.environ.get("REDISYNC_TEST_URL") or f"redis://127.0.0.1:{REDIS_PORT}/9"


def _guard_shared_server() -> None:
    """The shared server's guard in this process and, through ``PYTHONPATH``, in every Python
    process a test starts (`tests/guard/redisync_test_guard.py`)."""
    import tempfile
    from urllib.parse import urlsplit

    guard = str(Path(__file__).resolve().parent / "guard")
    parts = urlsplit(REAL_URL)
    os.environ["REDISYNC_TEST_SHARED"] = f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if os.environ.get("REDISYNC_TEST_GUARD_WORKER") != worker:  # one log per worker: each checks its own
        os.environ["REDISYNC_TEST_GUARD_DIR"] = tempfile.mkdtemp(prefix=f"redisync-guard-{worker}-")
        os.environ["REDISYNC_TEST_GUARD_WORKER"] = worker
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if guard not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([guard, *(p for p in paths if p)])
    sys.path.insert(0, guard)
    import redisync_test_guard

    redisync_test_guard.install()


_guard_shared_server()


@pytest.fixture(autouse=True)
def _nothing_server_wide_on_the_shared_redis():
    """A test whose process, or any process it started, sent a server-wide command to the shared
    Redis fails here, even where the refusal was caught."""
    import redisync_test_guard

    before = len(redisync_test_guard.refusals())
    yield
    new = redisync_test_guard.refusals()[before:]
    if new:
        pytest.fail("server-wide commands refused on the shared Redis:\n" + "\n".join(new), pytrace=False)


# ``scripts/test --fast`` (the development tier) draws a quarter of each property test's examples; the
# full tier, what CI runs, draws them all
FAST = os.environ.get("REDISYNC_TIER") == "fast"


def examples(n: int) -> int:
    """A property test's example count in this tier: ``n`` in the full tier, a quarter (at least 5) in the fast one."""
    return max(5, n // 4) if FAST else n


BACKENDS = ["embedded", "real"]


def real_redis_or_skip() -> str:
    try:
        redis.Redis.from_url(REAL_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as e:
        if os.environ.get("REDISYNC_REQUIRE_REDIS") == "1":
            pytest.fail(f"real Redis required but unreachable at {REAL_URL}: {e}")
        pytest.skip(f"no Redis at {REAL_URL}")
    return REAL_URL


def backend_url(backend: str) -> str | None:
    return real_redis_or_skip() if backend == "real" else None


def new_store(backend: str, run: str | None = None) -> Store:
    return redisync.connect(backend_url(backend), run=run or f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def make_store(backend):
    """Factory of fresh runs on the test's backend; every run is deleted afterwards."""
    made: list[Store] = []

    def make(run: str | None = None) -> Store:
        store = new_store(backend, run)
        made.append(store)
        return store

    yield make
    for store in made:
        store.delete()
        store.close()


# the modules the optional extras bring (``pip install '.[test]'`` alone has none of them)
EXTRA_OF = {
    "torch": "torch",
    "tqdm": "demo",
    "matplotlib": "demo",
    "scipy": "demo",
    "gymnasium": "study",
    "mujoco": "study",
    "prometheus_client": "monitoring",
    "tensorboard": "monitoring",
}


class _ModuleNeedingExtras(pytest.Module):
    """A test module that cannot import for want of an optional extra is skipped, naming the extra,
    where the tier does not require everything (``scripts/test-pip-user``); scripts/test and CI
    (``REDISYNC_REQUIRE_FRAMEWORKS=1``) keep the import error."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as e:
            cause = e.__cause__
            missing = getattr(cause, "name", None) if isinstance(cause, ModuleNotFoundError) else None
            top = (missing or "").split(".")[0]
            if top in EXTRA_OF and os.environ.get("REDISYNC_REQUIRE_FRAMEWORKS") != "1":
                pytest.skip(f"needs the {EXTRA_OF[top]} extra ({top} is not installed)", allow_module_level=True)
            raise


def pytest_pycollect_makemodule(module_path, parent):
    return _ModuleNeedingExtras.from_parent(parent, path=module_path)


def pytest_collection_modifyitems(items):
    """The training tests (``slow``) run one after another on one xdist worker (``--dist loadgroup``,
    the full tier's second run): each loads the machine's cores itself, so two at once would only
    slow both, while the fleets and servers tests run on the other worker beside them."""
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group("training"))


def pytest_runtest_setup(item):
    """``@pytest.mark.extras("torch", ...)``: a test that needs optional modules (or the dev extra's
    tools, by executable name) is skipped without them where the tier does not require everything."""
    for mark in item.iter_markers("extras"):
        missing = [m for m in mark.args if not _available(m)]
        if missing and os.environ.get("REDISYNC_REQUIRE_FRAMEWORKS") != "1":
            pytest.skip(f"needs {', '.join(missing)} (an optional extra: scripts/setup installs them all)")
    if item.get_closest_marker("cuda") is not None and not _cuda():
        pytest.skip(
            "needs a CUDA device: torch.cuda.is_available() is false here (scripts/gpu-check runs these on a GPU)"
        )


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _available(name: str) -> bool:
    if name in EXTRA_OF:
        return importlib.util.find_spec(name) is not None
    return (Path(sys.executable).parent / name).exists()  # a tool of the dev extra, beside the interpreter


def framework_or_skip(module: str):
    """Import a framework the drop-ins are tested inside (scripts/setup installs them); when
    ``REDISYNC_REQUIRE_FRAMEWORKS=1`` (scripts/test, CI) a missing one fails instead of skipping."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("REDISYNC_REQUIRE_FRAMEWORKS") == "1":
            pytest.fail(f"{module} is required (scripts/setup installs it) but does not import: {e}")
        pytest.skip(f"{module} is not installed (scripts/setup installs it): {e}", allow_module_level=True)


@pytest.fixture
def real_url() -> str:
    return real_redis_or_skip()


@pytest.fixture(scope="module")
def counted_url(tmp_path_factory) -> Iterator[str]:
    """A redis-server of the module's own, for a test that counts the server's commands: on the
    shared server another test (or a parallel worker) adds to the counts."""
    from .servers import RedisProcess

    server = RedisProcess(tmp_path_factory.mktemp("counted")).start()
    yield server.url
    server.stop()
